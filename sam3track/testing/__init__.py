"""Test helpers shipped with sam3track (no hardware needed)."""
