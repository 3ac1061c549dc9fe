"""Shared fixtures: one tiny bundle per test session, exported through the real checkpoint path."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .export_cache import cached_export, exported

REPO = Path(__file__).resolve().parents[1]
CLIPS = REPO / "examples" / "clips"


def pytest_configure(config):
    # The suite runs ONNX Runtime fp32 wherever it does not name a backend: the path the parity tests
    # hold to the reference, whatever backend="auto" would measure fastest on this CI machine's CPU
    # class. tests/test_backend_choice.py tests "auto" itself (it removes this variable).
    os.environ["SAM3TRACK_BACKEND"] = "onnxruntime"
    _size_xdist_worker_threads()
    _private_compile_cache(config)


def _private_compile_cache(config) -> None:
    """The compile cache (sam3track/backends/compile_cache.py) in a folder of this test process, removed
    at its end: tests never write the user's cache, and never read what an earlier run left there. Child
    processes the tests start inherit it. A run killed before its end (a CI timeout, ^C twice) leaves
    its folder behind: the next run removes the folders no live run holds the lock of."""
    if os.environ.get("SAM3TRACK_CACHE"):
        return
    import tempfile

    _remove_orphaned_caches(Path(tempfile.gettempdir()))
    folder = tempfile.mkdtemp(prefix=CACHE_PREFIX)
    _HELD.append(_lock(Path(folder)))  # held until this process ends, however it ends
    os.environ["SAM3TRACK_CACHE"] = folder
    config.add_cleanup(lambda: _release_and_remove(folder))


def _release_and_remove(folder: str) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    for handle in _HELD:  # the folder is gone: nothing left to guard (and no unclosed-file warning at exit)
        if handle is not None:
            handle.close()
    _HELD.clear()


CACHE_PREFIX = "sam3track-test-cache-"
_HELD: list = []


def _lock(folder: Path, wait: bool = True):
    """An exclusive lock on folder/.lock (an open file), or None when another process holds it (with
    wait=False) or the folder is gone. Locks die with their process: nothing stale survives a kill."""
    import fcntl

    try:
        handle = open(folder / ".lock", "a+")
    except OSError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError:
        handle.close()
        return None
    return handle


def _remove_orphaned_caches(tmp: Path) -> None:
    """Remove the private caches of earlier runs that no live process holds (gigabytes each); a
    folder without a lock file (named before locks) goes once a day old."""
    import shutil
    import time

    for folder in tmp.glob(CACHE_PREFIX + "*"):
        try:
            if (folder / ".lock").exists():
                held = _lock(folder, wait=False)
                if held is None:
                    continue  # a run still going
                held.close()
            elif time.time() - folder.stat().st_mtime < 86400:
                continue
        except OSError:
            continue  # removed meanwhile by another run
        shutil.rmtree(folder, ignore_errors=True)


def _size_xdist_worker_threads() -> None:
    """Each pytest-xdist worker's torch and ONNX Runtime pools sized to its share of the CPUs. With every
    library's default, two workers on 2 cores ran 4-6 spinning threads on them and the parity files took
    2.5x longer. Threads, not affinity: OpenVINO and PyAV change behaviour on one CPU, and the suite tests
    what a 2-core machine does (docs/testing.md, "Threads in test workers"). OpenVINO keeps its own
    default (every core); its tests are a small part of the run."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not os.environ.get("PYTEST_XDIST_WORKER") or count < 2:
        return
    share = max(1, (os.cpu_count() or 1) // count)
    os.environ["OMP_NUM_THREADS"] = str(share)  # torch in the processes a test starts
    from sam3track.backends import onnxruntime as ort_backend

    ort_backend.DEFAULT_THREADS = share  # ONNX Runtime's pools in this worker
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(share)


# A limit against hangs, never a verdict on speed: far above what a loaded 2-core machine takes.
HANG_SECONDS = 600


def communicate(proc: subprocess.Popen, what: str) -> tuple[str, str]:
    """``proc.communicate()`` that, past HANG_SECONDS, kills the child and fails naming the hang."""
    try:
        return proc.communicate(timeout=HANG_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"{what}: no exit within {HANG_SECONDS} s, a hang (stderr: {(err or '')[-2000:]})",
                    pytrace=False)


def run_child(args: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True)`` with the hang guard of ``communicate``."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    out, err = communicate(proc, what)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _cpu_isa() -> str:
    """The CPU class whose kernels ONNX Runtime and OpenVINO pick: "avx512-amx" (Xeon Sapphire Rapids and
    later), "avx512-bf16" (AMD Zen 4: AVX-512 with AVX512-BF16, no AMX), "avx512-vnni" (AVX-512 with VNNI
    and neither of those: Cascade Lake, Ice Lake), "avx512" (AVX-512 without VNNI: Skylake, whose int8
    kernels differ), "avx2", else "other"."""
    try:
        flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "").split()
    except OSError:
        return "other"
    if "avx512f" not in flags:
        return "avx2" if "avx2" in flags else "other"
    for flag, isa in (("amx_bf16", "avx512-amx"), ("avx512_bf16", "avx512-bf16"), ("avx512_vnni", "avx512-vnni")):
        if flag in flags:
            return isa
    return "avx512"


CPU_ISA = _cpu_isa()


def _worker_threads() -> int:
    """The threads each library's pool gets in this process: a worker's share under pytest-xdist (as
    _size_xdist_worker_threads sets it), else every CPU."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if os.environ.get("PYTEST_XDIST_WORKER") and count >= 2:
        return max(1, (os.cpu_count() or 1) // count)
    return os.cpu_count() or 1


# The CPU class rounding depends on: the ISA whose kernels run, and one thread or more (a single-thread
# pool splits the GEMMs and reductions differently, so on the same CPU its rounding differs too).
CPU_CLASS = CPU_ISA + ("/1-thread" if _worker_threads() == 1 else "")
# Where every rounding_xfail outcome was measured: a Xeon with AMX (the strict marks' first CI machines),
# AMD Zen 4 (../shared/docs/suite-profile.md: the same outcomes as the Xeon) and AMD EPYC with AVX2 only,
# with two threads; AMD EPYC (AVX2) and AMD Zen 4 also with one thread per pool (CI's two workers on 2
# cores); an Intel Xeon with AVX-512 and VNNI but neither bf16 nor AMX (model 106, Ice Lake) with two
# threads and with one (2026-12-07: the same outcomes). A mark's `diverges_on` names an ISA (every thread
# count) or an ISA with "/1-thread"; a mark measured on fewer classes names them in its `measured_on`.
MEASURED_CLASSES = ("avx512-amx", "avx512-bf16", "avx512-vnni", "avx2", "avx512-bf16/1-thread",
                    "avx512-vnni/1-thread", "avx2/1-thread")


def mask_iou(a, b) -> float:
    """IoU of two boolean masks; two empty masks agree (1.0)."""
    union = (a | b).sum()
    return 1.0 if union == 0 else (a & b).sum() / union


def rounding_xfail(reason: str, diverges_on: tuple[str, ...], measured_on: tuple[str, ...] = MEASURED_CLASSES):
    """A divergence that comes from the CPU kernels' fp32 (or int8) rounding, which depends on the CPU class
    they run on (CPU_CLASS): strict where it was measured to diverge, no mark where it was measured to pass,
    and non-strict on a class not measured (so it neither hides a real change nor fails on unknown
    hardware). measured_on: the classes this mark's outcome was measured on, where fewer than all."""
    if CPU_CLASS not in measured_on:
        return pytest.mark.xfail(strict=False, reason=f"{reason} (not measured on a {CPU_CLASS} CPU)")
    diverges = CPU_ISA in diverges_on or CPU_CLASS in diverges_on
    return pytest.mark.xfail(diverges, strict=True,
                             reason=f"{reason} (measured: diverges on {', '.join(diverges_on)} CPUs)")


# Bundles: exported through the real checkpoint path once per code version (tests/export_cache.py), copied
# into each run's own folder.
@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory) -> Path:
    from graphs.sam3.export import export_bundle

    out = tmp_path_factory.mktemp("bundles") / "tiny"
    return cached_export("tiny", {"seed": 0}, out, lambda o: export_bundle(None, o, tiny_seed=0, log=lambda *_: None))


@pytest.fixture(scope="session")
def tiny_plain_bundle(tmp_path_factory) -> Path:
    """The tiny bundle with standard-op attention (--attention plain): what om.convert (ATC) needs."""
    from graphs.sam3.export import export_bundle

    out = tmp_path_factory.mktemp("bundles") / "tiny-plain"
    return cached_export("tiny-plain", {"seed": 0}, out,
                         lambda o: export_bundle(None, o, tiny_seed=0, log=lambda *_: None, attention="plain"))


def sam31_reference_or_skip():
    """The SAM 3.1 reference (graphs.sam31.reference.Reference), or a skip saying how to build it.

    With SAM3TRACK_REQUIRE_SAM31_REFERENCE=1 (CI) a missing reference environment fails instead."""
    import os

    from graphs.sam31 import reference as ref

    env = ref.find_env()
    if env is None:
        if os.environ.get(ref.REQUIRE_VAR) == "1":
            pytest.fail(f"{ref.missing_reason()} ({ref.REQUIRE_VAR}=1)", pytrace=False)
        pytest.skip(ref.missing_reason())
    return ref.reference(env)


@pytest.fixture(scope="session")
def sam31_reference():
    """Meta's SAM 3.1 predictor run in its own env: ``.checkpoint`` (the seeded tiny checkpoint in
    Meta's format), ``.scenarios`` (the outputs folder of reference/sam31/run_scenarios.py), made and
    cached on first use. Skips when the env is absent (fails under SAM3TRACK_REQUIRE_SAM31_REFERENCE=1)."""
    return sam31_reference_or_skip()


@pytest.fixture(scope="session")
def sam31_bundle(sam31_reference, tmp_path_factory) -> Path:
    """The seeded SAM 3.1 checkpoint exported by the command line with its defaults (fused attention), as
    a user exports a real one; read-only, shared by the modules that need it."""
    from graphs.export import main

    out = tmp_path_factory.mktemp("sam31") / "bundle"
    argv = ["--family", "sam3.1", "--tiny", "--out", str(out)]
    return cached_export("sam31", {"argv": argv[:-1]}, out, lambda o: exported(main(argv[:-1] + [str(o)])),
                         inputs=(sam31_reference.checkpoint,))


@pytest.fixture(scope="session")
def sam31_plain_bundle(sam31_reference, tmp_path_factory) -> Path:
    """The seeded SAM 3.1 checkpoint exported with standard-op attention (what om.convert needs);
    read-only, shared by the OM conversion and acl tests."""
    from graphs.sam31.export import export_bundle

    out = tmp_path_factory.mktemp("sam31-plain") / "bundle"
    return cached_export("sam31-plain", {"attention": "plain"}, out,
                         lambda o: export_bundle(None, o, tiny=True, attention="plain", log=lambda *_: None),
                         inputs=(sam31_reference.checkpoint,))


@pytest.fixture(scope="session")
def fake_atc_path(tmp_path_factory) -> str:
    """A PATH with the fake ``atc`` first (sam3track.testing.fake_atc)."""
    import os

    from sam3track.testing.fake_atc import install_fake_atc

    bin_dir = tmp_path_factory.mktemp("fake-atc-bin")
    install_fake_atc(bin_dir)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
