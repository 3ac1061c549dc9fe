"""Backends that run a bundle's graphs: ONNX Runtime here; pyacl (Ascend OM) plugs in the same way."""

from ..errors import Sam3TrackError
from .base import Backend, DeviceTensor, Graph, TransferStats


def create_backend(name: str, device: str = "cpu", **options) -> Backend:
    if name in ("onnxruntime", "ort"):
        from .onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(device=device, **options)
    raise Sam3TrackError(f"unknown backend {name!r}; available here: onnxruntime")


__all__ = ["Backend", "DeviceTensor", "Graph", "TransferStats", "create_backend"]
