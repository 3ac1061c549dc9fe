"""Benchmark tools: `python -m benchmarks.run` (sam3track against transformers' Sam3VideoModel), plus the
single-purpose scripts (soak.py: RSS and pools over thousands of live frames; batch_scaling.py: Ray workers). Tools, not tests."""
