"""How the ONNX Runtime backend makes a graph's InferenceSession: optimised from the bundle file and saved
into the compile cache (compile_cache.py) on a miss, opened from the saved entry on a hit, its weights kept
in fp16 where asked (fp16_weights.py), and opened again after a release. A saved entry that does not open
is a miss, never a failed load. Also: handing freed heap pages back to the system after large sessions go.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from .. import load_notice
from ..errors import BackendError, BundleError


def stop_spinning_after_runs(options) -> None:
    """Workers spin while a run lasts, and stop when it ends. A frame runs several sessions in turn,
    each with its own pool, with numpy work between them: by default the last session's workers kept
    spinning into the next one's run (seeded SAM 3.1, 16 objects, 2-core AVX2 EPYC: 2.17-2.50 s over 5
    frames -> 1.73-1.78; docs/speed.md, "Threads")."""
    options.add_session_config_entry("session.force_spinning_stop", "1")


class SessionMaker:
    """Makes the sessions of one backend: its ONNX Runtime module, providers, threads, compile cache (a
    compile_cache.CompileCache or None) and weights ("fp32" or "fp16")."""

    def __init__(self, ort, providers: list[str], threads: int | None, cache, weights: str, install_hint: str):
        self.ort, self.providers, self.provider = ort, providers, providers[0]
        self.threads = threads or 0  # 0: ONNX Runtime's own default
        self.cache, self.weights, self.install_hint = cache, weights, install_hint

    def make(self, name: str, path: str, entry):
        """The session of graph `path`, made from the bundle file now (and saved into `entry`)."""
        return (self.optimise if self.weights == "fp32" else self.store_fp16)(name, path, entry)

    def options(self, optimise: bool):
        """Settings for one session: optimise=False for a graph the compile cache saved optimised."""
        options = self.ort.SessionOptions()  # a fresh one per session: saving and levels differ per graph
        options.log_severity_level = 3
        options.intra_op_num_threads = self.threads
        stop_spinning_after_runs(options)
        if not optimise:  # a graph the compile cache saved optimised already
            options.graph_optimization_level = self.ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            if self.weights == "fp16":  # each cast's fp32 copy made just before its consumer, not all at first
                options.execution_order = self.ort.ExecutionOrder.PRIORITY_BASED
        return options

    def open_saved(self, name: str, path: str, entry, model: str):
        """The session of the optimised graph the compile cache saved; one that does not open is removed
        from the cache and the graph optimised from `path` again."""
        self.cache.mark_used(entry)  # a deferred graph opens it long after the load stamped it
        try:
            session = self.ort.InferenceSession(model, sess_options=self.options(False),
                                                 providers=self.providers)
        except Exception as exc:  # a damaged entry is a miss, never a failed load
            self.cache.drop(model, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return self.make(name, path, entry)
        return self.checked(name, session)

    def store_fp16(self, name: str, path: str, entry):
        """The session of graph `path` with its weights in fp16 (fp16_weights.py): optimised in fp32
        first (from the cache when it has it), rewritten, saved into `entry` (or, with no cache, a
        scratch folder removed as soon as the session has mapped it) and opened from there."""
        import tempfile

        from .fp16_weights import convert

        optimised, scratch = self.optimised_file(name, path)
        writer, folder = None, None
        try:
            with load_notice.step(f"storing graph {name}'s weights in fp16"):
                writer = self.cache.ort_writer(entry) if entry is not None else None
                folder = writer.temp if writer is not None else tempfile.mkdtemp(prefix=f"sam3track-fp16-{name}-")
                convert(optimised, Path(folder))
                session = self.ort.InferenceSession(str(Path(folder) / "model.onnx"),
                                                     sess_options=self.options(False),
                                                     providers=self.providers)
        except Exception as exc:
            if writer is not None:
                writer.abandon()
            raise BundleError(f"onnxruntime cannot keep graph {name}'s weights in fp16 ({exc}); load it "
                              "with weights='fp32'") from exc
        finally:
            remove_folder(scratch)
            if writer is None:
                remove_folder(folder)  # ONNX Runtime has mapped its files: they live on until the session goes
        if writer is not None:
            writer.commit(session, path)  # the mapped files follow their folder's rename
        return self.checked(name, session)

    def optimised_file(self, name: str, path: str) -> tuple[str, str | None]:
        """Graph `path` optimised in fp32 and saved: the cache's entry (written now on a miss), or a
        file in a scratch folder (returned second, for the caller to remove) when there is no cache.
        Its session is not kept."""
        import tempfile

        from .compile_cache import configure_saving

        cache = self.cache
        entry = cache.ort_entry(self.ort, name, self.providers) if cache is not None else None
        hit = cache.ort_lookup(entry) if entry is not None else None
        if hit is None and entry is not None:
            self.optimise(name, path, entry)  # its session dropped at once: only the saved file is read
            return_freed_heap()
            hit = cache.ort_lookup(entry)
        if hit is not None:
            return hit[0], None
        folder = Path(tempfile.mkdtemp(prefix=f"sam3track-fp32-{name}-"))
        try:
            options = self.options(True)
            configure_saving(options, folder, prepacked=False)
            with load_notice.step(f"optimising graph {name} for ONNX Runtime"):
                self.ort.InferenceSession(path, sess_options=options, providers=self.providers)
        except BaseException as exc:
            remove_folder(str(folder))
            if isinstance(exc, Exception):
                raise BundleError(f"onnxruntime cannot load graph {name} from {path}: {exc}") from exc
            raise
        return_freed_heap()
        return str(folder / "model.onnx"), str(folder)

    def optimise(self, name: str, path: str, entry):
        """The session of graph `path`, optimised now (and saved into the compile cache's `entry`)."""
        writer = self.cache.ort_writer(entry) if entry is not None else None
        where = f" into the cache {entry.parent} (once per bundle, ONNX Runtime version and CPU)" if writer else ""
        try:
            with load_notice.step(f"optimising graph {name} for ONNX Runtime{where}"):
                options = self.options(True)
                if writer is not None:
                    writer.configure(options)
                try:
                    session = self.ort.InferenceSession(path, sess_options=options, providers=self.providers)
                except Exception:
                    if writer is None:
                        raise
                    writer.abandon()  # perhaps the saving that failed (a full disk): once more without it
                    writer = None
                    session = self.ort.InferenceSession(path, sess_options=self.options(True),
                                                         providers=self.providers)
        except Exception as exc:
            raise BundleError(f"onnxruntime cannot load graph {name} from {path}: {exc}") from exc
        if writer is not None:
            writer.commit(session, path)
        return self.checked(name, session)

    def checked(self, name: str, session):
        # ONNX Runtime falls back to the CPU, with only a log line, when a provider's libraries are
        # missing (onnxruntime-cann without libascendcl.so: ascend.md section 5); never run there silently.
        if session.get_providers()[0] != self.provider:
            raise BackendError(f"onnxruntime could not start {self.provider} for graph {name} and fell back to "
                               f"{', '.join(session.get_providers())}; {self.install_hint}")
        return session

    def reopen(self, name: str, path: str, entry: Path):
        """A released graph's session from its cache entry again. An entry gone or changed (pruned by
        another process) is made again from the bundle; a whole one that will not open (out of memory,
        out of file handles) is an error, and stays."""
        hit = self.cache.ort_lookup(entry)
        if hit is None:
            return self.make(name, path, entry)
        try:
            session = self.ort.InferenceSession(hit[0], sess_options=self.options(False),
                                                 providers=self.providers)
        except Exception as exc:
            raise BackendError(f"onnxruntime could not open graph {name} again from the compile cache {entry} "
                               f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); free memory, or "
                               "load with release_text_encoder=False to keep it open") from exc
        return self.checked(name, session)


_MALLOC_TRIM = None


def remove_folder(folder) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def return_freed_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere). The
    sessions of graphs optimised at load keep their weights in heap memory that glibc keeps for the life
    of the process once freed: after close() of a full-size predictor loaded without a cache entry, 3.5 GB
    stayed resident (a server that loads and closes bundles would grow by that much each time)."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        import ctypes

        try:  # the C library this process already has (no search for it)
            _MALLOC_TRIM = ctypes.CDLL(None).malloc_trim if sys.platform.startswith("linux") else False
        except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)
