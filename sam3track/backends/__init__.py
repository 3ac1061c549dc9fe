"""Backends that run a bundle's graphs: ONNX Runtime, and pyacl for Ascend OM bundles (backend="acl")."""

from ..errors import Sam3TrackError
from .base import Backend, DeviceTensor, Graph, TransferStats


def create_backend(name: str, device: str = "cpu", **options) -> Backend:
    if name in ("onnxruntime", "ort"):
        from .onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(device=device, **options)
    if name == "acl":
        from .acl import AclBackend

        unknown = sorted(set(options) - {"threads"})
        if unknown:
            raise Sam3TrackError(f"the acl backend takes no option {unknown[0]!r} (it runs the gears compiled into "
                                 "the OM bundle; gears= is an onnxruntime option)")
        return AclBackend(device=device, **options)
    raise Sam3TrackError(f"unknown backend {name!r}; available here: onnxruntime, acl")


__all__ = ["Backend", "DeviceTensor", "Graph", "TransferStats", "create_backend"]
