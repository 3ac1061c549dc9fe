"""What the acl backend knows about one OM model: its inputs and outputs as the OM desc reports
them, its compiled gears, and the checks that tie them to om_manifest.json and to a run's tensors.

(The backend itself, memory, datasets and the call sequence, is sam3track/backends/acl.py.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BackendError, BundleError, Sam3TrackError
from .acl_runtime import _ACL_DTYPES
from .base import Graph

HIDDEN_INPUT = "ascend_mbatch_shape_data"  # the extra, last input of every gear model [P-dyn 0107, MMD]


@dataclass
class _Io:
    """One model input or output as the OM desc reports it."""

    index: int  # om index: datasets are laid out in this order [ascend.md 3.3.2]
    name: str
    dtype: np.dtype
    dims: tuple[int, ...]  # inputs: -1 on gear axes; outputs: the largest gear's shape
    axes: tuple[str | None, ...]  # the manifest's axis name of every dim (None: a fixed dim)
    nbytes: int  # get_*_size_by_index: the largest gear's size [MMD; ascend.md 2]


@dataclass
class _Gear:
    sizes: dict[str, int]  # axis -> size in this gear ({} for a static model)
    value: Any  # what set_dynamic_* takes: a batch size, one get_input_dynamic_dims entry, None


@dataclass
class _GearData:
    """One (graph, gear)'s datasets; their data buffers are re-pointed on every run."""

    inputs: int
    outputs: int
    input_buffers: list[int]
    output_buffers: list[int]



@dataclass(eq=False)
class AclGraph(Graph):
    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    shapes: dict[str, tuple[int | None, ...]]
    dims: dict[str, tuple[int | str, ...]]
    sizes: dict[str, tuple[int, ...]]
    mode: str
    model_id: int
    desc: int
    inputs: list[_Io]  # om order, hidden input included
    outputs: list[_Io]  # om order
    hidden: _Io | None
    gears: list[_Gear]
    hidden_buffer: Any = None  # _Allocation of acl.py
    host_inputs: dict[str, Any] = field(default_factory=dict)
    output_buffers: dict[str, Any] = field(default_factory=dict)
    gear_data: dict[int, _GearData] = field(default_factory=dict)  # index into gears -> datasets



def _om_path(name: str, path: str, compiled: dict | None) -> Path:
    if compiled is None:
        raise BundleError(f"graph {name} ({path}): not an OM bundle: convert it with python -m om.convert BUNDLE "
                          "--soc SOC --out OM_BUNDLE, then load OM_BUNDLE with backend='acl'")
    if not compiled.get("om_file"):
        raise BundleError(f"graph {name}: planned, not compiled: run python -m om.convert on a machine with CANN's "
                          "atc, or the atc/*.atc.sh scripts it wrote (om_manifest.json has no om_file)")
    om_path = Path(compiled["root"]) / compiled["om_file"]
    if not om_path.is_file():
        raise BundleError(f"graph {name}: {om_path} is missing; convert the bundle again (python -m om.convert)")
    return om_path


def _check_names(where: str, compiled: dict, inputs: list[_Io], outputs: list[_Io]) -> None:
    """Bind by name, never by position: the OM's names must be the manifest's (the order may differ)."""
    want_in = sorted(t["name"] for t in compiled.get("inputs", []) if not t.get("hidden"))
    want_out = sorted(t["name"] for t in compiled.get("outputs", []))
    have_in, have_out = sorted(io.name for io in inputs), sorted(io.name for io in outputs)
    if (want_in and have_in != want_in) or (want_out and have_out != want_out):
        raise BundleError(f"{where}: the OM model has inputs {have_in} and outputs {have_out}, om_manifest.json "
                          f"lists {want_in} and {want_out}; convert the bundle again (python -m om.convert)")


def _check_sized(where: str, inputs: list[_Io], outputs: list[_Io]) -> None:
    """Buffers are sized from the desc: every output needs its largest-gear dims and size, every input
    its size (shape-range models report 0 [P-dyn 0047]; the acl backend runs gear and static models)."""
    for kind, ios in (("input", inputs), ("output", outputs)):
        for io in ios:
            if io.nbytes <= 0 or (kind == "output" and any(d < 0 for d in io.dims)):
                raise BundleError(f"{where}: {kind} {io.name} has dims {list(io.dims)} and size {io.nbytes} in the OM "
                                  "model: its size is not fixed at compile time (a shape-range model, or atc could not "
                                  "infer it); the acl backend runs static and gear models: convert the bundle again")


def _profile_sizes(where: str, entry: dict, visible: list[_Io], placeholders, axis_of) -> dict[str, int]:
    """One get_input_dynamic_dims entry -> axis sizes. Its dims are the concatenated full shapes of
    all inputs in om order [P-0226]; a list of only the -1 values is read too [unconfirmed which one
    every CANN version returns]."""
    values = [int(v) for v in entry["dims"][:entry.get("dimCount", len(entry["dims"]))]]
    if len(values) == sum(len(io.dims) for io in visible):
        offsets, at = {}, 0
        for io in visible:
            offsets[io.name] = at
            at += len(io.dims)
        picked = [values[offsets[io.name] + d] for io, d in placeholders]
    elif len(values) == len(placeholders):
        picked = values
    else:
        raise BundleError(f"{where}: a dynamic dims gear {values} matches neither the inputs' dims nor their "
                          f"{len(placeholders)} dynamic dims; convert the bundle again")
    sizes: dict[str, int] = {}
    for axis, value in zip(axis_of, picked):
        if sizes.setdefault(axis, value) != value:
            raise BundleError(f"{where}: a dynamic dims gear {values} gives axis {axis} two sizes; the model's inputs "
                              "do not share their axes as om_manifest.json says: convert the bundle again")
    return sizes


def _check_gears(where: str, gears: list[_Gear], sizes: dict[str, tuple[int, ...]]) -> None:
    """The gears compiled into the OM against om_manifest.json's axes: a mismatch between what the
    converter thinks atc compiled and what it did must surface here, not as a wrong result."""
    for axis in sorted({axis for gear in gears for axis in gear.sizes}):
        have = sorted({gear.sizes[axis] for gear in gears})
        want = sorted(sizes.get(axis, ()))
        if have != want:
            raise BundleError(f"{where}: the OM model was compiled with sizes {have} on axis {axis}, om_manifest.json "
                              f"says {want or 'none'}; convert the bundle again (python -m om.convert)")


def _check_io_names(graph: AclGraph, inputs, outputs) -> None:
    missing = [name for name in graph.input_names if name not in inputs]
    if missing:
        raise Sam3TrackError(f"graph {graph.name} needs input {missing[0]!r}")
    unknown = [name for name in list(inputs) + list(outputs) if name not in graph.input_names + graph.output_names]
    if unknown:
        raise BackendError(f"internal error: graph {graph.name} has no tensor {unknown[0]!r}; please report this")


def _as_om_dtype(graph: AclGraph, io: _Io, array) -> np.ndarray:
    """Host inputs in the dtype the OM takes (get_input_data_type, which ATC may have changed, e.g.
    --input_fp16_nodes [ascend.md 3.3.4]); only casts that keep the kind of value (or from bool)."""
    array = np.asarray(array)
    if array.dtype != io.dtype:
        if not (array.dtype == np.bool_ or np.can_cast(array.dtype, io.dtype, "same_kind")):
            raise BackendError(f"graph {graph.name}: input {io.name} is {array.dtype} on the host, the OM model takes "
                               f"{io.dtype}")
        array = array.astype(io.dtype)
    return np.ascontiguousarray(array)


def _gear_shape(io: _Io, gear: _Gear) -> tuple[int, ...]:
    """An output's shape at `gear`: its largest-gear dims with every gear axis at the gear's size."""
    return tuple(gear.sizes.get(axis, d) if axis is not None else d for d, axis in zip(io.dims, io.axes))


def pick_gear(graph: AclGraph, inputs) -> int:
    """The compiled gear the inputs' sizes on the graph's axes select; they must be one exactly
    (Backend.plan rounded them up; padding is the caller's)."""
    seen: dict[str, tuple[int, str]] = {}
    for io in graph.inputs:
        if io is graph.hidden:
            continue
        shape = tuple(inputs[io.name].shape)
        if len(shape) != len(io.dims):
            raise BackendError(f"graph {graph.name}: input {io.name} has shape {shape}, the OM model takes "
                               f"{len(io.dims)} dims {list(io.dims)}")
        for d, (want, have, axis) in enumerate(zip(io.dims, shape, io.axes)):
            if want >= 0:
                if want != have:
                    on = f"axis {axis} (dim {d})" if axis else f"dim {d}"
                    raise BackendError(f"graph {graph.name}: input {io.name} has size {have} on {on}, the OM "
                                       f"model was compiled for {want} only (shape {list(io.dims)})")
                continue
            axis = axis or f"{io.name}[{d}]"
            first = seen.setdefault(axis, (have, io.name))
            if first[0] != have:
                raise BackendError(f"graph {graph.name}: axis {axis} has size {first[0]} in {first[1]} but "
                                   f"{have} in {io.name}")
    for index, gear in enumerate(graph.gears):
        if all(gear.sizes.get(axis) == size for axis, (size, _) in seen.items()):
            return index
    for axis, (size, tensor) in seen.items():
        compiled = sorted({g.sizes[axis] for g in graph.gears if axis in g.sizes})
        if size not in compiled:
            raise BackendError(f"graph {graph.name}: input {tensor} has size {size} on axis {axis}, which is not "
                               f"a compiled gear (gears: {compiled}); plan the call with backend.plan(graph, "
                               f"{axis!r}, n) and pad to that size")
    raise BackendError(f"graph {graph.name}: sizes {({a: s for a, (s, _) in seen.items()})} are not one of the "
                       f"compiled profiles {[g.sizes for g in graph.gears]}")


# ------------------------------------------------------------------------ reading an OM desc
def describe(acl, value, name: str, om_path: Path, compiled: dict, model_id: int, desc: int) -> AclGraph:
    """The AclGraph of a loaded OM model, read from its desc by name and checked against its
    om_manifest.json entry. `value` is the backend's check of a (value, ret) pyacl result."""
    where = f"graph {name} ({om_path})"
    manifest_io = {t["name"]: t for t in compiled.get("inputs", []) + compiled.get("outputs", [])
                   if not t.get("hidden")}
    inputs, outputs = [], []
    for i in range(acl.mdl.get_num_inputs(desc)):
        tensor = acl.mdl.get_input_name_by_index(desc, i)
        dims = value("acl.mdl.get_input_dims", acl.mdl.get_input_dims(desc, i), f"{where} input {i}")
        inputs.append(_io(where, i, tensor, dims, acl.mdl.get_input_data_type(desc, i),
                               acl.mdl.get_input_size_by_index(desc, i), manifest_io))
    count = acl.mdl.get_num_outputs(desc)
    names = output_names(where, [acl.mdl.get_output_name_by_index(desc, i) for i in range(count)],
                         [t["name"] for t in compiled.get("outputs", [])])
    for i, tensor in enumerate(names):
        dims = value("acl.mdl.get_output_dims", acl.mdl.get_output_dims(desc, i), f"{where} output {i}")
        outputs.append(_io(where, i, tensor, dims, acl.mdl.get_output_data_type(desc, i),
                                acl.mdl.get_output_size_by_index(desc, i), manifest_io))
    hidden = next((io for io in inputs if io.name == HIDDEN_INPUT), None)
    visible = [io for io in inputs if io is not hidden]
    _check_sized(where, visible, outputs)
    _check_names(where, compiled, visible, outputs)
    gears = _read_gears(acl, value, where, compiled, desc, visible, hidden)
    sizes = {axis: tuple(int(s) for s in values) for axis, values in compiled["axes"].items()}
    _check_gears(where, gears, sizes)
    dynamic = {axis for axis, values in sizes.items() if len(values) > 1}
    tensors = visible + outputs
    return AclGraph(
        name=name, input_names=tuple(io.name for io in visible), output_names=tuple(io.name for io in outputs),
        shapes={io.name: tuple(None if a in dynamic or d < 0 else d for d, a in zip(io.dims, io.axes))
                for io in tensors},
        # axis names where the source graph had a symbolic dim (graph.sizes says what is compiled)
        dims={io.name: tuple(a if a is not None else d for d, a in zip(io.dims, io.axes)) for io in tensors},
        sizes=sizes, mode=compiled.get("mode", "static"), model_id=model_id, desc=desc,
        inputs=inputs, outputs=outputs, hidden=hidden, gears=gears)

def output_names(where: str, reported: list[str], manifest: list[str]) -> list[str]:
    """The tensor name of every OM output, in om index order.

    ONNX models' output names read `node:index:tensor` [P-0205; MMD takes split(':')[-1]], but a desc
    may give only `node:index` (ascend.md audit, risk 2): then the outputs are bound by position, in
    the ONNX output order om_manifest.json lists, which is the order ATC gives the om's outputs
    [unconfirmed: checked on hardware by python -m om.smoke]. Dtypes and ranks are checked against the
    manifest afterwards (_io), so a wrong order fails at load, not as a wrong result.
    """
    tails = [name.split(":")[-1] for name in reported]
    if not manifest or sorted(tails) == sorted(manifest):
        return tails
    if len(reported) != len(manifest):
        raise BundleError(f"{where}: the OM model has {len(reported)} outputs {reported}, om_manifest.json lists "
                          f"{len(manifest)} {manifest}; convert the bundle again (python -m om.convert)")
    if any(t in manifest for t in tails):  # some names match, some do not: not a naming scheme, a different model
        raise BundleError(f"{where}: the OM model's outputs {reported} are not om_manifest.json's {manifest}; "
                          "convert the bundle again (python -m om.convert)")
    return list(manifest)


def _io(where: str, index: int, name: str, dims: dict, acl_dtype: int, nbytes: int,
        manifest_io: dict) -> _Io:
    shape = tuple(int(d) for d in dims["dims"][:dims.get("dimCount", len(dims["dims"]))])
    if name == HIDDEN_INPUT:
        return _Io(index, name, np.dtype(np.uint8), shape, (None,) * len(shape), int(nbytes))
    if acl_dtype not in _ACL_DTYPES:
        raise BundleError(f"{where}: tensor {name} has aclDataType {acl_dtype}, which sam3track does not "
                          "read; convert the bundle again")
    spec = manifest_io.get(name)
    if spec and spec.get("dtype") and np.dtype(spec["dtype"]) != np.dtype(_ACL_DTYPES[acl_dtype]):
        raise BundleError(f"{where}: tensor {name} is {np.dtype(_ACL_DTYPES[acl_dtype])} in the OM model but "
                          f"{spec['dtype']} in om_manifest.json; convert the bundle again")
    axes = tuple(spec.get("axes") or (None,) * len(shape)) if spec else (None,) * len(shape)
    if len(axes) != len(shape):
        raise BundleError(f"{where}: tensor {name} has dims {list(shape)} in the OM model but "
                          f"{len(axes)} axes in om_manifest.json; convert the bundle again")
    return _Io(index, name, np.dtype(_ACL_DTYPES[acl_dtype]), shape, axes, int(nbytes))

def _read_gears(acl, value, where: str, compiled: dict, desc: int, visible: list[_Io], hidden: _Io | None) -> list[_Gear]:
    """The gears the OM model itself was compiled with (never what the manifest thinks it holds)."""
    placeholders = [(io, d) for io in visible for d, size in enumerate(io.dims) if size < 0]
    mode = compiled.get("mode", "static")
    if hidden is None:
        if placeholders or mode != "static":
            found = ("dynamic dims without gears (a shape-range model, which the acl backend does not run)"
                     if placeholders else "no gears")
            raise BundleError(f"{where}: om_manifest.json says mode {mode!r} but the OM model has {found}; "
                              "convert the bundle again (python -m om.convert) with gear modes")
        return [_Gear({}, None)]
    axis_of = [(io.axes[d] or f"{io.name}[{d}]") for io, d in placeholders]
    if mode == "dynamic_batch":
        info = value("acl.mdl.get_dynamic_batch", acl.mdl.get_dynamic_batch(desc), where)
        batches = [int(b) for b in info["batch"][:info.get("batchCount", len(info["batch"]))]]
        if not batches:
            raise BundleError(f"{where}: om_manifest.json says dynamic_batch but the OM model has no batch "
                              "gears; convert the bundle again")
        return [_Gear({axis: b for axis in axis_of}, b) for b in batches]
    if mode == "dynamic_dims":
        # index -1 ("reserved, fixed to -1"); the dims call needs a count >= the model's gears, and
        # returns one entry per gear the model has [hicann/ge model_om2.cpp aclmdlGetInputDynamicDims]
        count = value("acl.mdl.get_input_dynamic_gear_count",
                      acl.mdl.get_input_dynamic_gear_count(desc, -1), where)
        planned = len(compiled.get("profiles") or ())
        if count < max(planned, 1):
            raise BundleError(f"{where}: the OM model reports {count} dynamic dims gears, om_manifest.json planned "
                              f"{planned}; convert the bundle again (python -m om.convert)")
        entries = value("acl.mdl.get_input_dynamic_dims", acl.mdl.get_input_dynamic_dims(desc, -1, count), where)
        return [_Gear(_profile_sizes(where, entry, visible, placeholders, axis_of), entry)
                for entry in entries[:count]]
    raise BundleError(f"{where}: the OM model has gears but om_manifest.json says mode {mode!r}; the acl "
                      "backend runs static, dynamic_batch and dynamic_dims models: convert the bundle again")
