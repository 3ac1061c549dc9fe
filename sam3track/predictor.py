"""The predictor: a loaded bundle on a backend, from which sessions start."""

from __future__ import annotations

import os
import warnings
import weakref
from pathlib import Path

import numpy as np

from .backend_choice import Choice, choose
from .backends import create_backend
from .backends.compile_cache import CompileCache
from .bundle import Bundle
from .call_sizes import available_memory, default_gears, objects_per_call, static_gears
from .families.sam3.config import TrackerConfig
from .errors import BundleError, CapacityWarning, SessionClosedError, VideoError
from .session_base import check_frame_size
from .tracking_session import TrackingSession
from .tokenizer import PromptTokenizer


class Predictor:
    def __init__(self, bundle: Bundle, backend, config: TrackerConfig):
        self.bundle, self.backend, self.config = bundle, backend, config
        self.tokenizer = PromptTokenizer(bundle.tokenizer_file, config.text_length, config.pad_token_id)
        # One dict shared with every session's frame loop: close() empties it for all of them.
        self.graphs = {}
        try:
            for name in bundle.manifest["graphs"]:
                self.graphs[name] = backend.load(name, str(bundle.graph_path(name)), bundle.compiled(name))
            bundle.check_graph_shapes(self.graphs)
        except BaseException:
            self.graphs.clear()
            backend.close()
            raise
        self._sessions: weakref.WeakSet[TrackingSession] = weakref.WeakSet()
        self.closed = False
        self.backend_choice: Choice | None = None  # which path load() took and why

    @classmethod
    def load(cls, bundle_dir, backend: str = "auto", device: str = "cpu", verify: bool = True,
             threads: int | None = None, gears=None, precision: str | None = None,
             shapes: str | None = None, weights: str | None = None, compile_cache=None,
             release_text_encoder: bool | None = None, **config_overrides) -> "Predictor":
        """Open and check a bundle, then load its graphs. Keyword overrides change TrackerConfig fields,
        e.g. mask_nms=False, fill_holes=False to compare with transformers.

        backend: "auto" (default: the fastest installed path whose results stay within the parity
        tolerances of ONNX Runtime fp32 on this machine, measured once and cached; see
        sam3track/backend_choice.py and `predictor.backend_choice`), "onnxruntime" (device "cpu",
        "cuda:N" or "cann:N"), "openvino" (device "cpu"; pip install 'sam3track[openvino]') or "acl"
        (an OM bundle, device "npu:N").
        threads: intra-op threads for every backend (ONNX Runtime's intra_op_num_threads, OpenVINO's
        INFERENCE_NUM_THREADS; acl accepts and ignores it). None (default) keeps the backend's own
        default, every core: on the 2-core machine these graphs were measured on, that was within
        noise of the best setting; set it when several predictors share a machine.
        precision (openvino only): "fp32" (default) or "bf16" on CPUs with bf16 support (AMX,
        AVX512-BF16): faster, with results that may differ from fp32 (other objects on some frames);
        any other backend runs each graph at the precision the bundle stores it in.
        shapes (openvino only): "dynamic" (default: each graph compiled once), "rows" (a graph
        compiled again, a second or two at mid size, once its calls settle on one count of objects, then
        faster at many objects: docs/speed.md "Rows fixed") or "static"
        (compiled again for each new set of call shapes, about 2 s a graph at mid size, then up to 40%
        faster per call): for long videos and streams.
        weights (onnxruntime and openvino, on the CPU): "fp32" (default) or "fp16": each graph's large
        weights kept in fp16 and converted where used (ONNX Runtime computes in fp32: at full size about
        1.6 GB less after load and a lower peak, frames about 20% slower; OpenVINO at either precision:
        bf16 at full size peaks at 7.1 GB instead of 10.1), results within fp16 rounding of fp32, but in
        bf16 fp16 weights can change which objects are found (fp16's exponent range is narrower: a mask
        was lost on auto's gate clip); not checked by the fidelity gate: asked for, never chosen by
        "auto" (docs/speed.md "Memory at full size"). With precision= or shapes= it runs on OpenVINO,
        else on ONNX Runtime.
        gears (onnxruntime, openvino): "compiled" runs an OM bundle's gears, or {axis: sizes} pads every
        call to those sizes, so CPU runs take the Ascend padding path. OpenVINO with shapes="static" pads a
        SAM 3 bundle's calls to call_sizes.static_gears by default (a few compiles per graph, not one per
        object count; SAM 3.1 runs each call at its own shapes).
        compile_cache: None (default: on, unless SAM3TRACK_COMPILE_CACHE=0), True, False, or a folder:
        where optimised graphs and checked sha256s are kept between loads (docs/speed.md, "Load time").
        release_text_encoder (ONNX Runtime, or OpenVINO with dynamic or rows shapes; compile cache on): free the
        text encoder after each prompt and open it again from the cache at the next (about 0.8 s at full
        size): None (default) when its
        weights are 512 MiB or more (the full-size model's 1.2 GB then stay out of every frame's peak),
        True always, False never."""
        if not isinstance(bundle_dir, (str, os.PathLike)):
            raise BundleError(f"load() takes the path of a bundle directory, not {type(bundle_dir).__name__}; "
                              "export one with python -m graphs.export")
        bundle = Bundle.open(Path(bundle_dir), verify=verify, cache=compile_cache)
        config = bundle.family.config_from_manifest(bundle.manifest, **config_overrides)
        options = {"threads": threads} if threads is not None else {}
        options["compile_cache"] = CompileCache.for_bundle(bundle, compile_cache, release_text_encoder)
        choice = None
        if weights is not None:
            options["weights"] = weights
        if backend == "auto":
            choice = choose(bundle, device, threads, precision, shapes, gears,
                            lambda c: cls(bundle, create_backend(c.backend, device, **options, **c.options), config),
                            weights)
            backend, precision, shapes = choice.backend, choice.options.get("precision"), choice.options.get("shapes")
        if precision is not None:
            options["precision"] = precision
        if shapes is not None:
            options["shapes"] = shapes
        gears = gears if gears is not None else planned_gears(config, backend, device, shapes)
        if gears is not None:
            options["gears"] = gears
        elif backend in ("onnxruntime", "ort") and str(device).partition(":")[0] == "cpu" \
                and isinstance(config, TrackerConfig):
            budget = budget_gears(config)  # the host memory a call may take: not a choice to record
            options.update({"gears": budget} if budget else {})
        if str(device).partition(":")[0] == "cpu":
            warn_over_budget(bundle, config, weights)
        predictor = cls(bundle, create_backend(backend, device, **options), config)
        options["compile_cache"].prune()  # the cache stays within its cap, this load's entries kept
        recorded = ("threads", "compile_cache") + (("gears",) if gears is None else ())
        predictor.backend_choice = choice or Choice(
            backend, {k: v for k, v in options.items() if k not in recorded}, "backend= given")
        return predictor

    def start_session(self, source=None, keep_history: bool = True) -> TrackingSession:
        """source: a video file, an image folder, an array or sequence of RGB frames, a FrameSource, or
        None for a live stream fed through session.track(frame).
        keep_history: keep, in a budgeted host store, the memories a later correction on a frame
        tracked long ago reads (docs/corrections.md). False for one pass that never goes back (the
        CLI, batch): they are dropped as the pass leaves them. Live streams never keep them."""
        if self.closed:
            raise SessionClosedError("this predictor is closed; load the bundle again")
        from .video.reader import FrameSource

        owned = False
        if source is not None:
            if not isinstance(source, (str, os.PathLike, np.ndarray, list, tuple, FrameSource)):
                raise VideoError(f"start_session() takes a video file or image folder path, an array or list of RGB "
                                 f"frames, a FrameSource, or None for a live stream; not {type(source).__name__}")
            from .video import open_source

            owned = not isinstance(source, FrameSource)
            source = open_source(source)
            try:
                check_frame_size(source.height, source.width, f"the video {source.name}")
            except VideoError:
                if owned:
                    source.close()
                raise
        session = self.bundle.family.session_class()(self, source, owns_source=owned, keep_history=keep_history)
        self._sessions.add(session)
        return session

    @property
    def transfers(self):
        return self.backend.transfers

    def close(self) -> None:
        """Close every session, then release the graphs and all device memory; idempotent."""
        if self.closed:
            return
        self.closed = True
        for session in list(self._sessions):
            session.close()
        self.graphs.clear()
        self.backend.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def planned_gears(config, backend: str, device: str, shapes: str | None) -> dict | None:
    """The sizes a SAM 3 load pads calls to where gears= is not given and every new call shape is compiled
    again: ONNX Runtime on CANN (default_gears) and OpenVINO with static shapes (static_gears); None: each
    call at its own size."""
    if not isinstance(config, TrackerConfig):
        return None
    if backend in ("onnxruntime", "ort") and str(device).startswith("cann"):
        return default_gears(config)
    if backend in ("openvino", "ov") and shapes == "static":
        return static_gears(config)
    return None


def memory_budget(config) -> int | None:
    """The bytes a load may plan for: memory_budget_mib, or half the memory available now (None: unknown)."""
    if getattr(config, "memory_budget_mib", 0):
        return config.memory_budget_mib * 2 ** 20
    available = available_memory()
    return None if available is None else available // 2


def warn_over_budget(bundle: Bundle, config, weights: str | None) -> None:
    """One CapacityWarning naming the knob where a CPU load plans more memory than is available now: the
    graphs' weights, or those and the memory pools once full (pool_objects objects' memories)."""
    available = available_memory()
    if available is None:
        return
    held = bundle.graph_bytes() // (2 if weights == "fp16" else 1)
    if held > available:
        knob = "" if weights == "fp16" else ", or load with backend='onnxruntime', weights='fp16' (about half)"
        warnings.warn(CapacityWarning(
            f"the graphs of {bundle.root} hold {_size(held)} and {_size(available)} of memory is available: the "
            f"load may be killed. Free memory{knob}"), stacklevel=4)
    elif isinstance(config, TrackerConfig):
        pools = config.capacities()["memory_rows"] * config.feature_grid ** 2 * config.memory_dim * 4  # fp32 rows
        if held + pools > available:
            warnings.warn(CapacityWarning(
                f"the memory pools for pool_objects={config.pool_objects} objects take {pools / 2**20:,.0f} MiB once "
                f"full; with the graphs' {held / 2**20:,.0f} MiB that is more than the {available / 2**20:,.0f} MiB "
                "available: load with a smaller pool_objects (or max_num_objects), or free memory"), stacklevel=4)


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GB" if nbytes >= 2**30 else f"{nbytes / 2**20:,.0f} MB"


def budget_gears(config: TrackerConfig) -> dict | None:
    """ONNX Runtime's call sizes on the objects axis that keep one propagation call within
    config.memory_budget_mib (0: half the memory available now): every count up to the most that fit,
    so calls are split without padding. None when a call of pool_objects objects fits already."""
    budget = memory_budget(config)
    if budget is None:
        return None
    most = objects_per_call(config, budget)
    return None if most >= config.pool_objects else {"objects": tuple(range(1, most + 1))}

