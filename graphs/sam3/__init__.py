"""SAM 3's export side (transformers' Sam3VideoModel): modules.py (its graphs as torch wrappers), specs.py
(their inputs and outputs), checkpoint.py (reading a Hugging Face snapshot), tiny.py (seeded presets),
export.py (the bundle) and check.py (each graph against transformers). graphs/sam31/ builds on these
modules; both use the shared machinery at graphs/ (onnx_export, comparison, ops, spec_types).
"""
