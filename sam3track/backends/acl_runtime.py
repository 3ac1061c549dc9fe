"""pyacl itself, for the acl backend: importing it, acl.init once per process, return codes turned
into errors, and the constants the backend uses. Sources as in acl.py (ascend.md tags)."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BackendError, Sam3TrackError

# acl constants [ascend.md 2.1]
ACL_SUCCESS = 0
ACL_ERROR_REPEAT_INITIALIZE = 100002  # benign: someone else in this process called acl.init [MMD]
ACL_ERROR_REPEAT_FINALIZE = 100037
ACL_MEM_MALLOC_HUGE_FIRST = 0  # the policy mmdeploy and acllite use
MEMCPY_HOST_TO_DEVICE, MEMCPY_DEVICE_TO_HOST, MEMCPY_DEVICE_TO_DEVICE = 1, 2, 3

# aclDataType -> numpy [acl_base.h via ascend.md 2.1]
_ACL_DTYPES = {0: np.float32, 1: np.float16, 2: np.int8, 3: np.int32, 4: np.uint8, 6: np.int16, 7: np.uint16,
               8: np.uint32, 9: np.int64, 10: np.uint64, 11: np.float64, 12: np.bool_}

# Hints for the codes whose cause is known [ERR, ascend.md 1.1 and 2.2]
_HINTS = {
    100012: "the OM file was built by another CANN version: run python -m om.convert again with this CANN's atc",
    100013: "the OM file was built by another CANN version: run python -m om.convert again with this CANN's atc",
    107002: "no current context on this thread",
    145013: "the gear was not compiled into the model",
    507011: "model execution failed; if every model fails, compare --soc_version in om_manifest.json with npu-smi info",
}


# ------------------------------------------------------------------------ acl.init, once per process
# acl.init may be called once per process (a second call returns 100002) and acl.finalize once
# [ascend.md 3.1.1]. Backends share one refcount per acl module object (a test installs a fresh fake
# module each time; a leaked backend of an earlier module must not make this one skip acl.init).
_INIT_LOCK = threading.Lock()
_INIT_STATE: dict[int, list] = {}  # id(acl module) -> [module, users, owned]


def _acquire_acl(acl) -> None:
    with _INIT_LOCK:
        state = _INIT_STATE.get(id(acl))
        if state is None or state[0] is not acl:
            ret = acl.init()
            if ret not in (ACL_SUCCESS, ACL_ERROR_REPEAT_INITIALIZE):
                raise _error(acl, "acl.init", ret)
            # 100002: another library initialised acl in this process; it finalizes, not us [MMD]
            state = _INIT_STATE[id(acl)] = [acl, 0, ret == ACL_SUCCESS]
        state[1] += 1


def _release_acl(acl) -> None:
    with _INIT_LOCK:
        state = _INIT_STATE.get(id(acl))
        if state is None or state[0] is not acl:
            return
        state[1] -= 1
        if state[1] > 0:
            return
        del _INIT_STATE[id(acl)]
        if state[2]:
            ret = acl.finalize()
            if ret not in (ACL_SUCCESS, ACL_ERROR_REPEAT_FINALIZE):
                raise _error(acl, "acl.finalize", ret)


def _error(acl, call: str, code, what: str = "") -> BackendError:
    try:
        message = acl.get_recent_err_msg() or ""
    except Exception:  # the message is a courtesy; the code is the fact
        message = ""
    hint = _HINTS.get(code)
    where = f" ({what})" if what else ""
    text = f"{call} failed{where} with acl error {code}"
    if hint:
        text += f" [{hint}]"
    if message:
        text += f": {str(message).strip()}"
    return BackendError(text)


def _parse_device(device: str) -> int:
    match = re.fullmatch(r"npu(?::(\d+))?", str(device))
    if match is None:
        raise Sam3TrackError(f"unknown device {device!r} for the acl backend; use 'npu:N' (N = the NPU's index, "
                             "as npu-smi info lists them), e.g. 'npu:0'")
    return int(match.group(1) or 0)


def _import_acl():
    try:
        import acl
    except ImportError as exc:
        raise Sam3TrackError(
            "the acl backend needs pyacl (the `acl` module), which comes with the CANN toolkit: source its "
            "set_env.sh (e.g. . /usr/local/Ascend/ascend-toolkit/set_env.sh) before starting Python. Tests "
            "without CANN use the emulator: sam3track.testing.acl_emulator.install()") from exc
    return acl


@dataclass(eq=False)
class _Allocation:
    """One rt.malloc block. `graph_owned` blocks (a graph's input/output buffers) are released by
    close() only: free() on a result tensor is a no-op, as results are only valid until the graph's
    next run. Other blocks belong to the DeviceTensors (and views) that hold them."""

    ptr: int
    nbytes: int
    what: str
    graph_owned: bool = False
    freed: bool = False
    collected: Any = field(default=None, repr=False)  # weakref.finalize: queues the block when unreferenced
