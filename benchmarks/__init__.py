"""Benchmark tools: `python -m benchmarks.run` (sam3track against transformers' Sam3VideoModel), plus the
older single-purpose scripts (compare_reference.py, soak.py, batch_scaling.py). Tools, not tests."""
