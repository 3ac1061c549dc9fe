"""Convert a sam3track bundle into an OM bundle for Ascend NPUs (ATC-ready ONNX, atc command lines, .om files).

    python -m om.convert BUNDLE --soc Ascend910B2 --out OM_BUNDLE

Modules: plan (dynamic modes, gears, profiles and the rules ATC enforces), prepass (the ONNX rewrite that
makes a graph ATC-friendly, checked with onnxruntime), atc (command lines, running atc, finding its output),
manifest (om_manifest.json), convert (the CLI). Nothing here imports torch: a conversion host needs only
onnx, onnxruntime and, to compile, CANN's atc.
"""
