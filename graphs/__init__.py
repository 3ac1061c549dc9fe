"""Build side of sam3track: turns a transformers SAM 3 video checkpoint into a bundle of ONNX graphs.

Everything here may use torch; the runtime package ``sam3track`` never imports this package.
"""
