"""SAM 3.1 export."""
