"""The fake OM artefact (notes/om-contract.md) and the model it describes, run with onnxruntime (CPU).

Format: b"SAM3TRACK-FAKE-OM\\n" + uint64 LE header length + UTF-8 JSON header + the ONNX bytes.
The model desc comes from the header only (om input order = header input order = ONNX input order,
plus the hidden `ascend_mbatch_shape_data` last in gear modes); the ONNX is only what runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from . import constants as C
from .memory import AclError

MAGIC = b"SAM3TRACK-FAKE-OM\n"
MODES = ("static", "dynamic_batch", "dynamic_dims", "shape_range")

_ONNX_TYPES = {
    "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
    "tensor(int8)": "int8", "tensor(int16)": "int16", "tensor(int32)": "int32", "tensor(int64)": "int64",
    "tensor(uint8)": "uint8", "tensor(uint16)": "uint16", "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64", "tensor(bool)": "bool",
}


def parse_fake_om(blob: bytes) -> tuple[dict, bytes]:
    """Split a fake OM into (header, onnx bytes); AclError 100012 on anything malformed."""
    bad = C.ACL_ERROR_DESERIALIZE_MODEL
    if not blob.startswith(MAGIC):
        raise AclError(bad, "not a sam3track fake OM (bad magic); real .om files need real hardware", "model_file")
    off = len(MAGIC)
    if len(blob) < off + 8:
        raise AclError(bad, "fake OM truncated before the header length", "model_file")
    n = int.from_bytes(blob[off:off + 8], "little")
    if len(blob) < off + 8 + n:
        raise AclError(bad, f"fake OM truncated: header claims {n} bytes", "model_file")
    try:
        header = json.loads(blob[off + 8:off + 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AclError(bad, f"fake OM header is not JSON: {e}", "model_file") from None
    if not isinstance(header, dict) or header.get("fake_om_version") != 1:
        raise AclError(bad, f"fake OM header version {header.get('fake_om_version') if isinstance(header, dict) else None!r} != 1", "model_file")
    if header.get("mode") not in MODES:
        raise AclError(bad, f"fake OM mode {header.get('mode')!r} not one of {MODES}", "model_file")
    return header, blob[off + 8 + n:]


@dataclass
class TensorSpec:
    name: str  # om name (outputs: "<node>:<index>:<tensor>")
    dtype: np.dtype  # om dtype (what the host must write / will read)
    dims: tuple[int, ...]  # -1 on dynamic axes (outputs: the largest gear)
    tensor: str = ""  # ONNX tensor name
    ranges: list | None = None  # shape_range inputs: per dim [lo, hi] or int

    @property
    def acl_dtype(self) -> int:
        return C.NUMPY_TO_ACL.get(self.dtype.name, C.ACL_DT_UNDEFINED)


def nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


@dataclass(eq=False)
class OmModel:
    name: str
    header: dict
    mode: str
    inputs: list[TensorSpec]  # without the hidden input
    outputs: list[TensorSpec]
    gears: list[tuple[int, ...]]  # batch: (b,); dims: the values of the -1s in input order; else []
    session: object = field(repr=False, default=None)
    onnx_dtypes: dict[str, np.dtype] = field(default_factory=dict)
    _out_dims: dict = field(default_factory=dict, repr=False)  # gear -> output shapes (run-derived)

    @classmethod
    def from_bytes(cls, blob: bytes, name: str) -> "OmModel":
        header, onnx_bytes = parse_fake_om(blob)
        bad = C.ACL_ERROR_DESERIALIZE_MODEL
        try:
            ranges = header.get("ranges") or {}
            inputs = [TensorSpec(d["name"], np.dtype(d["dtype"]), tuple(int(x) for x in d["dims"]),
                                 d["name"], ranges.get(d["name"])) for d in header["inputs"]]
            outputs = [TensorSpec(d["name"], np.dtype(d["dtype"]), tuple(int(x) for x in d["dims"]),
                                  d.get("tensor") or d["name"].split(":")[-1]) for d in header["outputs"]]
        except (KeyError, TypeError, ValueError) as e:
            raise AclError(bad, f"fake OM header inputs/outputs malformed: {e!r}", "model_file") from None
        mode = header["mode"]
        n_dyn = sum(d == -1 for s in inputs for d in s.dims)
        if mode == "dynamic_batch":
            gears = [(int(b),) for b in header.get("batch_sizes") or []]
        elif mode == "dynamic_dims":
            gears = [tuple(int(v) for v in p) for p in header.get("dynamic_dims") or []]
            if any(len(g) != n_dyn for g in gears):
                raise AclError(bad, f"dynamic_dims profiles must hold {n_dyn} values (one per -1)", "model_file")
        else:
            gears = []
        if mode in ("dynamic_batch", "dynamic_dims"):
            if not gears or header.get("hidden_input") != C.HIDDEN_INPUT:
                raise AclError(bad, f"{mode} model without gears or hidden input", "model_file")
        elif mode == "static" and n_dyn:
            raise AclError(bad, "static model with -1 dims", "model_file")
        m = cls(name, header, mode, inputs, outputs, gears)
        m._make_session(onnx_bytes)
        return m

    def _make_session(self, onnx_bytes: bytes) -> None:
        import onnxruntime as ort

        from ...backends.ort_sessions import stop_spinning_after_runs

        so = ort.SessionOptions()
        # intra-op threads at ONNX Runtime's default (one per core), as the onnxruntime backend runs: the
        # emulator's results do not depend on it, and one thread made every acl test 1.5-2x slower
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        stop_spinning_after_runs(so)  # as the onnxruntime backend's sessions
        try:
            self.session = ort.InferenceSession(onnx_bytes, so, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - any ORT failure is a parse failure of the model
            raise AclError(C.ACL_ERROR_PARSE_MODEL, f"embedded ONNX does not load: {e}", "model_file") from None
        types = {i.name: _ONNX_TYPES.get(i.type) for i in self.session.get_inputs()}
        graph_outs = {o.name for o in self.session.get_outputs()}
        for s in self.inputs:
            if s.name not in types:
                raise AclError(C.ACL_ERROR_PARSE_MODEL, f"header input {s.name!r} is not an ONNX input", "model_file")
            self.onnx_dtypes[s.name] = np.dtype(types[s.name] or "float32")
        for s in self.outputs:
            if s.tensor not in graph_outs:
                raise AclError(C.ACL_ERROR_PARSE_MODEL, f"header output {s.tensor!r} is not an ONNX output", "model_file")

    # ---- desc
    @property
    def gear_mode(self) -> bool:
        return self.mode in ("dynamic_batch", "dynamic_dims")

    @property
    def num_inputs(self) -> int:
        return len(self.inputs) + (1 if self.gear_mode else 0)

    @property
    def hidden_index(self) -> int:
        return len(self.inputs)

    @property
    def hidden_size(self) -> int:
        # one uint64 per dynamic value (GE copies cur_dynamic_dims into the hidden buffer) [unconfirmed]
        return 8 * len(self.gears[0])

    def shapes_at(self, gear: tuple[int, ...] | None) -> list[tuple[int, ...]]:
        """Input shapes at a gear (static: the dims)."""
        if gear is None:
            return [s.dims for s in self.inputs]
        vals = iter(gear)
        out = []
        for s in self.inputs:
            if self.mode == "dynamic_batch":
                out.append(tuple(gear[0] if d == -1 else d for d in s.dims))
            else:
                out.append(tuple(next(vals) if d == -1 else d for d in s.dims))
        return out

    def input_size(self, i: int) -> int:
        if self.gear_mode and i == self.hidden_index:
            return self.hidden_size
        s = self.inputs[i]
        if self.mode == "shape_range":
            return 0 if -1 in s.dims else nbytes(s.dims, s.dtype)  # [P-dyn 0047]; static input of a range model [unconfirmed]
        if self.gear_mode:
            return max(nbytes(shapes[i], s.dtype) for shapes in map(self.shapes_at, self.gears))
        return nbytes(s.dims, s.dtype)

    def output_size(self, i: int) -> int:
        s = self.outputs[i]
        if self.mode == "shape_range" or -1 in s.dims:
            return 0
        return nbytes(s.dims, s.dtype)

    def flat_dims(self, gear: tuple[int, ...]) -> list[int]:
        """get_input_dynamic_dims' per-gear `dims`: the full shapes of all inputs concatenated [P-0226]."""
        return [d for shape in self.shapes_at(gear) for d in shape]

    def output_dims(self, gear: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Output shapes at a gear: run-derived (a zero-input dry run, cached)."""
        if gear not in self._out_dims:
            feeds = {s.name: np.zeros(shape, self.onnx_dtypes[s.name]) for s, shape in zip(self.inputs, self.shapes_at(gear))}
            self._out_dims[gear] = [tuple(r.shape) for r in self._run_onnx(feeds)]
        return self._out_dims[gear]

    # ---- execution
    def _run_onnx(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run([s.tensor for s in self.outputs], feeds)

    def run(self, arrays: list[np.ndarray], gear: tuple[int, ...] | None) -> list[np.ndarray]:
        """Run on om-dtype input arrays; outputs converted to the om output dtypes."""
        feeds = {s.name: a.astype(self.onnx_dtypes[s.name], copy=False) for s, a in zip(self.inputs, arrays)}
        outs = self._run_onnx(feeds)
        if gear is not None:
            self._out_dims.setdefault(gear, [tuple(o.shape) for o in outs])
        return [np.ascontiguousarray(np.asarray(o).astype(s.dtype, copy=False)) for s, o in zip(self.outputs, outs)]

    def check_range(self, i: int, shape: tuple[int, ...]) -> str | None:
        """Why `shape` is outside input i's compiled range (shape_range models), or None."""
        s = self.inputs[i]
        if len(shape) != len(s.dims):
            return f"rank {len(shape)} != compiled rank {len(s.dims)}"
        for k, (v, d) in enumerate(zip(shape, s.dims)):
            r = s.ranges[k] if s.ranges and k < len(s.ranges) else d
            if isinstance(r, list):
                lo, hi = r
                if v < lo or (hi != -1 and v > hi):
                    return f"dim {k} = {v} outside [{lo}, {hi}]"
            elif r != -1 and v != r:
                return f"dim {k} = {v} != {r}"
            elif v < 0:
                return f"dim {k} = {v} < 0"
        return None
