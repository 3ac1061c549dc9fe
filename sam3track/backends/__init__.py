"""Backends that run a bundle's graphs: ONNX Runtime, OpenVINO (CPU), and pyacl for Ascend OM bundles
(backend="acl")."""

from ..errors import Sam3TrackError
from .base import Backend, DeviceTensor, Graph, TransferStats


BACKENDS = ("onnxruntime", "openvino", "acl")


def create_backend(name: str, device: str = "cpu", **options) -> Backend:
    """options, common to every backend: threads (intra-op threads: ONNX Runtime's
    intra_op_num_threads, OpenVINO's INFERENCE_NUM_THREADS; acl accepts and ignores it; None: the
    backend's own default, every core); compile_cache (a compile_cache.CompileCache of the bundle, made by
    the predictor: the folder of optimised graphs and the graphs to defer; acl ignores it). Backend-
    specific: gears (onnxruntime, openvino), weights (onnxruntime, openvino), precision, shapes and cache_dir
    (openvino)."""
    threads = options.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise Sam3TrackError(f"threads must be a whole number >= 1, or None for the backend's default; "
                             f"not {threads!r}")
    if name not in ("openvino", "ov") and options.get("precision") is not None:
        raise Sam3TrackError(f"precision= is an openvino option (fp32 or bf16); the {name} backend runs each graph "
                             "at the precision the bundle stores it in (graphs.export --int8 quantises graphs): "
                             "leave precision unset or use backend='openvino'")
    if name not in ("openvino", "ov") and options.get("shapes") is not None:
        raise Sam3TrackError(f"shapes= is an openvino option (dynamic, rows or static); the {name} backend runs "
                             "every call at its own size (onnxruntime) or at the bundle's compiled gears (acl): "
                             "leave shapes unset or use backend='openvino'")
    stores_weights = ("onnxruntime", "ort", "openvino", "ov")
    if name not in stores_weights and options.get("weights") not in (None, "fp32"):
        raise Sam3TrackError(f"weights= is an onnxruntime and openvino option (fp32 or fp16, on the CPU); the {name} "
                             "backend keeps each graph's weights as it compiles them: leave weights unset or use "
                             "backend='onnxruntime'")
    if options.get("weights") is None or name not in stores_weights:
        options.pop("weights", None)  # nothing asked for, or fp32: what every other backend keeps
    if name not in ("openvino", "ov"):
        options.pop("precision", None)  # None: nothing asked for
        options.pop("shapes", None)
    if name in ("onnxruntime", "ort"):
        from .onnxruntime import OnnxRuntimeBackend

        _refuse(name, options, {"threads", "gears", "compile_cache", "weights"},
                "precision=, shapes= and cache_dir= are openvino options")
        return OnnxRuntimeBackend(device=device, **options)
    if name in ("openvino", "ov"):
        try:
            from .openvino import OpenVinoBackend
        except ImportError as exc:
            raise Sam3TrackError(f"backend='openvino' needs the openvino package ({exc}); "
                                 "pip install 'sam3track[openvino]'") from exc
        _refuse(name, options, {"threads", "precision", "cache_dir", "shapes", "compile_cache", "weights", "gears"},
                "its options: threads, precision, shapes, gears, weights, cache_dir, compile_cache")
        return OpenVinoBackend(device=device, **options)
    if name == "acl":
        from .acl import AclBackend

        options.pop("compile_cache", None)  # an OM bundle is compiled already
        _refuse(name, options, {"threads"}, "it runs the gears compiled into the OM bundle; gears= is an "
                                            "onnxruntime and openvino option")
        return AclBackend(device=device, **options)
    raise Sam3TrackError(f"unknown backend {name!r}; available here: {', '.join(BACKENDS)}")


def _refuse(name: str, options: dict, known: set, why: str) -> None:
    unknown = sorted(set(options) - known)
    if unknown:
        raise Sam3TrackError(f"the {name} backend takes no option {unknown[0]!r} ({why})")


__all__ = ["BACKENDS", "Backend", "DeviceTensor", "Graph", "TransferStats", "create_backend"]
