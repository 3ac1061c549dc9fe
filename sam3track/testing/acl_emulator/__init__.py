"""A strict in-process emulator of the pyacl `acl` module (Ascend runtime), for tests without hardware.

    from sam3track.testing.acl_emulator import install

    with install() as emu:            # sys.modules["acl"] (and acl.rt / acl.mdl / acl.util) is the fake
        import acl
        acl.init(); acl.rt.set_device(0)
        ...
        assert emu.stats.d2h_count == 1
    # the previous sys.modules entries (if any) are back

In pytest: `acl_emu = pytest_fixture(strict_kind=False)` at module level gives a fixture named
`acl_emu` yielding the emulator.

Calls follow ascend.md §2 exactly: `(value, ret)` tuples, bare `ret` codes or bare values per call;
handles and pointers are ints; wrong argument counts/types raise TypeError; no keyword arguments.
`acl.get_recent_err_msg()` names the failing call and the rule broken, e.g.
"acl.rt.memcpy: [kind] kind H2D but the copy is D2H ... (error 107000)". Every diagnostic is also
appended to `emu.stats.errors`.

Models: `acl.mdl.load_from_file` reads the fake OM of notes/om-contract.md (magic, uint64 LE header
length, JSON header, ONNX bytes) and runs the ONNX with onnxruntime (CPU) at the selected gear's
shapes, reading the om-dtype bytes straight from the input buffers.

Rules always enforced (documented behaviour, no switch):
  - call before acl.init -> 100001; init twice -> 100002; finalize twice -> 100037
  - malloc(0) / malloc_host(0); memcpy count > dest_max; a copy or buffer range running past its
    allocation; null pointers; use after free, double free, use of destroyed handles
  - memcpy_async host-to-host -> 207000
  - dataset buffer counts = get_num_inputs / get_num_outputs, the hidden gear input included
    (100017 / 100018); each buffer device memory and at least the bytes this run needs
  - gear models: a compiled gear selected with set_dynamic_batch_size / set_input_dynamic_dims on
    the input dataset (hidden-input index) before execute; non-compiled gear -> 145013; set_dynamic_*
    on a static or shape-range model -> 100019; set_dynamic_hw_size -> 100000 (not emulated)
  - shape-range models: dynamic inputs need set_dataset_tensor_desc, shapes inside the compiled
    ranges (145021); output shapes come back through get_dataset_tensor_desc
A selected gear persists: like GE, set_dynamic_* writes the gear (one uint64 per dynamic value) into
the hidden input's device buffer and execute reads it from there, so a gear set once stays selected
for every execute with that buffer until another set_dynamic_* (or a memcpy) overwrites it. A fresh
hidden buffer is poison (0xFF...) and fails execute with 145013 until a gear is set.

Switches (keyword arguments of install(); all strict by default; also `emu.rules.<name>` mid-test):
  strict_kind=True        memcpy kind must match the address classes (DEFAULT=4 always accepted).
                          False: kind ignored, as CANN 8.x does.
  strict_async_host=True  memcpy_async host side must be malloc_host memory and both sides 64-B
                          aligned (107008 for alignment).
  deferred_async=True     memcpy_async / execute_async take effect at synchronize_stream of that
                          stream only; destroy_stream with pending work fails. False: immediate.
  strict_context=True     thread-local current context required (107002); streams (107003) and
                          models (107004) used only in their own context. False: fall back to the
                          context last made current in any thread; no ownership checks.
  strict_leaks=True       resources alive at reset_device (of the last device) / finalize /
                          destroy_context make the call return EMU_LEAK (507000) after tearing
                          them down. False: only recorded in stats.leaks.
  poison=True             new device and malloc_host memory is 0xFF (NaN as float); False: zeros.
  soc_version=None        set to e.g. "Ascend910B2": a model whose header soc differs fails
                          execute with 507011.
  device_count=1          valid device ids.

Stats (`emu.stats`, `emu.reset_stats()`): h2d/d2h/d2d/h2h _count and _bytes, copies [(direction,
nbytes)] per copy call (async ones at enqueue), executes Counter {om file name: n} (load_from_mem:
"mem:<id>"), datasets_created, data_buffers_created, live_allocations, live_device_bytes,
peak_device_bytes, leaks [str], errors [str].

Not emulated: device (RC) run mode, dynamic image size, fp16 precision effects, events, get_mem_info,
op-level (acl.op) calls, multiple real devices' memory separation, aclmdlGetTensorRealName.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

from . import constants
from .constants import *  # noqa: F401,F403
from .memory import AclError, EmulatorError
from .models import MAGIC, OmModel, parse_fake_om
from .runtime import Emulator, Rules, Stats

__all__ = ["install", "pytest_fixture", "Emulator", "Rules", "Stats", "AclError", "EmulatorError",
           "MAGIC", "OmModel", "parse_fake_om", "constants"]

_NAMES = ("acl", "acl.rt", "acl.mdl", "acl.util")


@contextmanager
def install(**rules):
    """Put a fresh fake `acl` into sys.modules for the duration; yields the Emulator."""
    emu = Emulator(**rules)
    saved = {n: sys.modules.get(n) for n in _NAMES}
    sys.modules["acl"] = emu.acl
    for n in ("rt", "mdl", "util"):
        sys.modules[f"acl.{n}"] = getattr(emu.acl, n)
    try:
        yield emu
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


def pytest_fixture(**rules):
    """A pytest fixture (function scope) yielding an installed Emulator: `acl_emu = pytest_fixture()`."""
    import pytest

    @pytest.fixture
    def acl_emu():
        with install(**rules) as emu:
            yield emu

    return acl_emu
