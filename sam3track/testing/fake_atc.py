"""A fake ``atc`` (Ascend Tensor Compiler) for machines without CANN.

    python -m sam3track.testing.fake_atc --framework=5 --model=g.onnx --output=om/g --soc_version=Ascend910B2 \\
        --input_format=ND --input_shape="x:-1,3" --dynamic_batch_size=1,2,4 --precision_mode_v2=origin

It checks the command line by the documented ATC rules and writes a fake OM artefact that the acl emulator
loads; ``install_fake_atc(bin_dir)`` writes an ``atc`` shim for tests to put on PATH. Needs onnx (and
onnxruntime for shape inference); never torch. What it checks and writes: docs/ascend.md, "The fake atc".
"""

from __future__ import annotations

import json
import platform
import stat
import struct
import sys
from pathlib import Path

# The command-line rules as data, with their sources (om/atc_rules.py): SoC names, (1, 100] gears and
# profiles [D-batch, D-dims], at most 4 values per --dynamic_dims profile and rank-4 inputs [D-dims4].
from om.atc_rules import MAX_DIMS_INPUT_RANK, MAX_DIMS_PER_PROFILE, soc_problem
from om.atc_rules import MAX_PROFILES as MAX_GEARS
from om.atc_rules import MIN_PROFILES as MIN_GEARS
from om.onnx_ops import problems

MAGIC = b"SAM3TRACK-FAKE-OM\n"
FAKE_OM_VERSION = 1
HIDDEN_INPUT = "ascend_mbatch_shape_data"
SUCCESS = "ATC run success, welcome to the next use"
FAILURE = "ATC run failed, Please check the detail log, Try 'atc --help' for more information"
PRECISION_MODE_V2 = ("fp16", "origin", "cube_fp16in_fp32out", "mixed_float16", "mixed_bfloat16")
PRECISION_MODE = ("force_fp16", "force_fp32", "cube_fp16in_fp32out", "allow_fp32_to_fp16", "must_keep_origin_dtype",
                  "allow_mix_precision", "allow_mix_precision_fp16", "allow_mix_precision_bf16", "allow_fp32_to_bf16")
LOG_LEVELS = ("debug", "info", "warning", "error", "null")
INPUT_FORMATS = ("ND", "NCHW", "NHWC", "NCDHW", "NDHWC")
IMPLMODES = ("high_performance", "high_precision", "high_performance_for_all", "high_precision_for_all")
GEAR_OPTIONS = ("dynamic_batch_size", "dynamic_image_size", "dynamic_dims")
DYNAMIC_OPTIONS = GEAR_OPTIONS + ("input_shape_range",)
# Options the fake understands. Others exist in real ATC; the fake refuses them rather than ignore them.
KNOWN = {"framework", "model", "output", "soc_version", "input_format", "input_shape", "log", "precision_mode",
         "precision_mode_v2", "input_fp16_nodes", "keep_dtype", "modify_mixlist", "op_select_implmode",
         "optypelist_for_implmode", "op_precision_mode", *DYNAMIC_OPTIONS}
NOT_EMULATED = {"dynamic_image_size", "input_shape_range", "out_nodes", "insert_op_conf", "mode"}


class AtcFailure(Exception):
    """One ATC-style error line: code + message."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")


def _invalid(option: str, value, reason: str) -> AtcFailure:
    return AtcFailure("E10001", f"Value [{value}] for parameter [--{option}] is invalid. Reason: {reason}")


# ------------------------------------------------------------------------------------------- parsing
def parse_argv(argv: list[str]) -> dict[str, str]:
    """``--k=v`` or ``--k v`` -> {k: v}. No space is allowed after '=' (ascend.md 1.1)."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--"):
            raise AtcFailure("E10001", f"unexpected argument [{tok}]; options are written --name=value")
        key, sep, value = tok[2:].partition("=")
        if not sep:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise AtcFailure("E10004", f"parameter [--{key}] has no value")
            value, i = argv[i + 1], i + 1
        if sep and value == "" and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            raise AtcFailure("E10001", f"parameter [--{key}] is followed by a space after '='; write --{key}=VALUE")
        if key in NOT_EMULATED:
            raise AtcFailure("E10001", f"parameter [--{key}] is not emulated by the fake atc")
        if key not in KNOWN:
            raise AtcFailure("E10001", f"unknown parameter [--{key}]")
        if key in opts:  # stricter than documented: a repeated option is a caller bug either way
            raise AtcFailure("E10001", f"parameter [--{key}] is given more than once")
        opts[key] = value
        i += 1
    return opts


def _int(option: str, text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _invalid(option, text, f"{what} must be an integer") from None


def parse_input_shape(text: str) -> list[tuple[str, list]]:
    """``"a:1,-1;b:2~8,3;c:"`` -> [(name, [int | -1 | (lo, hi)]), ...]; an empty dim list is a scalar."""
    result = []
    for part in text.split(";"):
        if not part:
            continue
        name, sep, dims_text = part.rpartition(":")
        if not sep or not name:
            raise _invalid("input_shape", part, "write name:d0,d1,... for each input, ';'-separated")
        dims: list = []
        for d in (dims_text.split(",") if dims_text else []):
            if "~" in d:
                lo, _, hi = d.partition("~")
                lo, hi = _int("input_shape", lo, "a range bound"), _int("input_shape", hi, "a range bound")
                if lo < 1 or (hi != -1 and hi < lo):
                    raise _invalid("input_shape", part, f"range {d} is empty or below 1")
                dims.append((lo, hi))
            else:
                v = _int("input_shape", d, "a dim")
                if v < -1 or v == 0:
                    raise _invalid("input_shape", part, f"dim {v}: sizes are >= 1, or -1 for a dynamic dim")
                dims.append(v)
        result.append((name, dims))
    return result


def _positive_list(option: str, text: str) -> list[int]:
    values = [_int(option, v, "each value") for v in text.split(",") if v != ""]
    if not values or any(v < 1 for v in values):
        raise _invalid(option, text, "values must be positive integers")
    return values


# ------------------------------------------------------------------------------------------- checks
def _load_model(path: str):
    import onnx

    if not path or not Path(path).is_file():
        raise _invalid("model", path, "the file does not exist")
    try:
        return onnx.load(path)
    except Exception as exc:  # onnx raises DecodeError and friends
        raise _invalid("model", path, f"not a readable ONNX model ({exc})") from exc


def _check_ops(model) -> None:
    """Every node must be one ATC's ONNX parser registers at the model's opset, with attributes its
    kernels take (om/onnx_ops.py: the operator table with its sources); the first that is not fails
    with the error code ATC gives (E19010 custom domain, E16002 no parser, EZ9999 kernel limits)."""
    found = problems(model)
    if found:
        p = found[0]
        more = f" ({len(found) - 1} more)" if len(found) > 1 else ""
        message = p.message if p.code == "E19010" else f"Op [{p.node}, optype [{p.op}]]: {p.message}"
        raise AtcFailure(p.code, message + more)


def _graph_inputs(model) -> list:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _np_dtype(elem_type: int) -> str:
    import onnx

    return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name


def check(opts: dict[str, str]) -> dict:
    """Validate a parsed command line against the model; return the fake OM header."""
    _check_options(opts)
    fmt = opts.get("input_format")
    model = _load_model(opts["model"])
    _check_ops(model)
    inputs = _graph_inputs(model)
    names = [i.name for i in inputs]
    shapes = _input_shapes(opts, inputs, names)

    holes = [(n, k) for n in names for k, d in enumerate(shapes[n]) if d == -1]
    ranged = any(isinstance(d, tuple) for n in names for d in shapes[n])
    _check_dynamic_options(opts, fmt, ranged)

    header = {"fake_om_version": FAKE_OM_VERSION, "soc_version": opts["soc_version"], "mode": "static",
              "input_format": fmt or "ND",
              "precision": {"precision_mode_v2": opts.get("precision_mode_v2"),
                            "precision_mode": opts.get("precision_mode")},
              "hidden_input": None, "batch_sizes": None, "dynamic_dims": None, "ranges": None}
    largest = {n: [d[1] if isinstance(d, tuple) else d for d in shapes[n]] for n in names}
    if "dynamic_batch_size" in opts:
        _batch_gears(opts, header, holes, largest)
    elif "dynamic_dims" in opts:
        _dims_gears(opts, fmt, header, holes, largest)
    elif holes or ranged:
        # -1 or lo~hi without a gear option: shape range ("-1 = any size") [D-shape].
        header.update(mode="shape_range",
                      ranges={n: [list(d) if isinstance(d, tuple) else d for d in shapes[n]] for n in names})

    fp16 = set(filter(None, opts.get("input_fp16_nodes", "").split(";")))
    for n in fp16:
        if n not in names:
            raise _invalid("input_fp16_nodes", n, f"the model has no input {n}")
    header["inputs"] = [{"name": i.name, "dtype": "float16" if i.name in fp16 else _np_dtype(i.type.tensor_type.elem_type),
                         "dims": [d if isinstance(d, int) else -1 for d in shapes[i.name]]} for i in inputs]
    header["outputs"] = _outputs(model, largest)
    return header


def _check_options(opts: dict[str, str]) -> None:
    """The checks that need only the command line, before the model is read."""
    if opts.get("framework") != "5":
        raise _invalid("framework", opts.get("framework"), "the fake atc converts ONNX models only (--framework=5)")
    for required in ("model", "output", "soc_version"):
        if not opts.get(required):
            raise AtcFailure("E10004", f"parameter [--{required}] is required")
    output = opts["output"]
    if output.endswith(".om"):
        raise _invalid("output", output, "give the path prefix without .om; ATC appends it")
    why = soc_problem(opts["soc_version"])  # a real chip name, not any 'Ascend*' [D-soc, GE-soc]
    if why:
        raise _invalid("soc_version", opts["soc_version"], why)
    if "log" in opts and opts["log"] not in LOG_LEVELS:
        raise _invalid("log", opts["log"], f"choose from {'|'.join(LOG_LEVELS)}")
    if "precision_mode" in opts and "precision_mode_v2" in opts:
        raise AtcFailure("E10001", "parameters [--precision_mode] and [--precision_mode_v2] cannot be used together")
    if "precision_mode_v2" in opts and opts["precision_mode_v2"] not in PRECISION_MODE_V2:
        raise _invalid("precision_mode_v2", opts["precision_mode_v2"], f"choose from {'|'.join(PRECISION_MODE_V2)}")
    if "precision_mode" in opts and opts["precision_mode"] not in PRECISION_MODE:
        raise _invalid("precision_mode", opts["precision_mode"], f"choose from {'|'.join(PRECISION_MODE)}")
    if "op_select_implmode" in opts and opts["op_select_implmode"] not in IMPLMODES:
        raise _invalid("op_select_implmode", opts["op_select_implmode"], f"choose from {'|'.join(IMPLMODES)}")
    if "optypelist_for_implmode" in opts and "op_select_implmode" not in opts:
        raise AtcFailure("E10001", "[--optypelist_for_implmode] needs [--op_select_implmode]")
    for option in ("keep_dtype", "modify_mixlist", "op_precision_mode"):
        if option in opts and not Path(opts[option]).is_file():
            raise _invalid(option, opts[option], "the file does not exist")
    fmt = opts.get("input_format")
    if fmt is not None and fmt not in INPUT_FORMATS:
        raise _invalid("input_format", fmt, f"choose from {'|'.join(INPUT_FORMATS)}")


def _input_shapes(opts: dict[str, str], inputs: list, names: list[str]) -> dict[str, list]:
    """--input_shape: names are the graph's inputs, every input covered, ranks and fixed dims as in the model."""
    if "input_shape" in opts:
        given = parse_input_shape(opts["input_shape"])
    else:
        given = [(i.name, [d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim])
                 for i in inputs]
    seen = [n for n, _ in given]
    for n in seen:
        if n not in names:
            raise _invalid("input_shape", n, f"the model has no input {n}; its inputs are {names}")
        if seen.count(n) > 1:
            raise _invalid("input_shape", n, "the input is listed twice")
    # Stricter than documented: ATC may take a partial --input_shape; a converter must not rely on that.
    missing = [n for n in names if n not in seen]
    if missing:
        raise _invalid("input_shape", opts.get("input_shape", ""), f"inputs {missing} are not listed")
    shapes = dict(given)
    for i in inputs:
        model_dims = i.type.tensor_type.shape.dim
        dims = shapes[i.name]
        if len(dims) != len(model_dims):
            raise _invalid("input_shape", i.name, f"rank {len(dims)} but the model's input has rank {len(model_dims)}")
        for k, (d, md) in enumerate(zip(dims, model_dims)):
            # Stricter than documented: a fixed size that contradicts the model fails later in ATC anyway.
            if isinstance(d, int) and d != -1 and md.HasField("dim_value") and md.dim_value != d:
                raise _invalid("input_shape", i.name, f"dim {k} is {d} but the model fixes it at {md.dim_value}")
    return shapes


def _check_dynamic_options(opts: dict[str, str], fmt: str | None, ranged: bool) -> None:
    """At most one dynamic option, with --input_format, and no lo~hi range beside it."""
    dynamic = [o for o in DYNAMIC_OPTIONS if o in opts]
    if len(dynamic) > 1:  # E10009 [GE-opt]
        raise AtcFailure("E10009", f"parameters {['--' + o for o in dynamic]} are mutually exclusive; give one")
    if dynamic and fmt is None:
        raise AtcFailure("E10004", f"--{dynamic[0]} requires --input_format")
    if dynamic and ranged:
        raise _invalid("input_shape", opts["input_shape"], f"a lo~hi range cannot be combined with --{dynamic[0]}")


def _batch_gears(opts: dict[str, str], header: dict, holes: list, largest: dict) -> None:
    """--dynamic_batch_size: only dim 0 may be -1; sets the header's gears and the largest shapes."""
    batches = _positive_list("dynamic_batch_size", opts["dynamic_batch_size"])
    if not holes:
        raise _invalid("dynamic_batch_size", opts["dynamic_batch_size"], "no input dim is -1 in --input_shape")
    bad = [(n, k) for n, k in holes if k != 0]
    if bad:
        raise _invalid("input_shape", opts["input_shape"], f"-1 at dim {bad[0][1]} of {bad[0][0]}; with "
                       "--dynamic_batch_size only dim 0 may be -1")
    _check_gear_count("dynamic_batch_size", [(b,) for b in batches])
    header.update(mode="dynamic_batch", hidden_input=HIDDEN_INPUT, batch_sizes=batches)
    for n, k in holes:
        largest[n][k] = max(batches)


def _dims_gears(opts: dict[str, str], fmt: str | None, header: dict, holes: list, largest: dict) -> None:
    """--dynamic_dims: ND format, one value per -1 in each profile; sets the header's gears and the largest shapes."""
    if fmt != "ND":
        raise _invalid("input_format", fmt, "--dynamic_dims requires --input_format=ND")
    if not holes:
        raise _invalid("dynamic_dims", opts["dynamic_dims"], "no input dim is -1 in --input_shape")
    profiles = [_positive_list("dynamic_dims", p) for p in opts["dynamic_dims"].split(";") if p != ""]
    for p in profiles:
        if len(p) != len(holes):  # E10003 [GE-opt CheckAndParseDynamicDims]
            raise AtcFailure("E10003", f"Value [{','.join(map(str, p))}] for parameter [--dynamic_dims] is invalid. "
                             f"Reason: {len(p)} values for {len(holes)} -1 dims in --input_shape; each profile gives "
                             "one value per -1, in input order")
    _check_gear_count("dynamic_dims", [tuple(p) for p in profiles])
    if len(holes) > MAX_DIMS_PER_PROFILE:
        raise _invalid("dynamic_dims", opts["dynamic_dims"], f"{len(holes)} dynamic dims per profile; at most "
                       f"{MAX_DIMS_PER_PROFILE} [D-dims4]")
    ranks = {n: len(largest[n]) for n, _ in holes if len(largest[n]) > MAX_DIMS_INPUT_RANK}
    if ranks:
        name, rank = next(iter(ranks.items()))
        raise _invalid("input_shape", name, f"rank {rank} with a -1 under --dynamic_dims; inputs of rank <= "
                       f"{MAX_DIMS_INPUT_RANK} only [D-dims4]")
    header.update(mode="dynamic_dims", hidden_input=HIDDEN_INPUT, dynamic_dims=profiles)
    for j, (n, k) in enumerate(holes):
        largest[n][k] = max(p[j] for p in profiles)


def _check_gear_count(option: str, gears: list[tuple]) -> None:
    """(1, 100] gears [D-batch, D-dims], none twice [GE-mbo CheckDynamicParams: E10035, E10039]."""
    if len(gears) < MIN_GEARS:
        raise AtcFailure("E10035", f"[--{option}] has {len(gears)} gear(s); give at least {MIN_GEARS}")
    if len(gears) > MAX_GEARS:
        raise _invalid(option, ";".join(",".join(map(str, g)) for g in gears), f"{len(gears)} gears; at most "
                       f"{MAX_GEARS}")
    if len(set(gears)) != len(gears):
        raise AtcFailure("E10039", f"[--{option}] lists the same gear twice")


# ------------------------------------------------------------------------------------------- outputs
def _outputs(model, shapes: dict[str, list[int]]) -> list[dict]:
    """Output names as ATC reports them ("<node>:<index>:<tensor>") and dims at the given input shapes."""
    producers = {}
    for idx, node in enumerate(model.graph.node):
        for k, out in enumerate(node.output):
            producers[out] = (node.name or f"{node.op_type}_{idx}", k)
    dims = _infer_output_dims(model, shapes)
    result = []
    for o in model.graph.output:
        node, index = producers.get(o.name, (o.name, 0))
        result.append({"name": f"{node}:{index}:{o.name}", "tensor": o.name,
                       "dtype": _np_dtype(o.type.tensor_type.elem_type), "dims": dims[o.name]})
    return result


def _infer_output_dims(model, shapes: dict[str, list[int]]) -> dict[str, list[int]]:
    """Output dims with the inputs at ``shapes`` (-1 = unknown): ONNX shape inference, then onnxruntime's
    symbolic inference (onnx's own loses batch dims through Reshape/Gather chains), then one run on zeros
    when every input size is known, else -1 where all fail."""
    import copy

    import onnx

    m = copy.deepcopy(model)
    for i in _graph_inputs(m):
        for d, v in zip(i.type.tensor_type.shape.dim, shapes[i.name]):
            d.Clear()
            if v == -1:
                d.dim_param = f"{i.name}_dynamic"
            else:
                d.dim_value = v
    for o in m.graph.output:
        o.type.tensor_type.ClearField("shape")  # declared output dims may be stale; infer them afresh
    del m.graph.value_info[:]

    def read(proto):
        return {o.name: [d.dim_value if d.HasField("dim_value") else -1 for d in o.type.tensor_type.shape.dim]
                for o in proto.graph.output}

    dims = {o.name: [] for o in m.graph.output}
    try:
        dims = read(onnx.shape_inference.infer_shapes(m, data_prop=True))
    except Exception:  # inference errors leave the fallback to decide
        pass
    if any(not d or -1 in d for d in dims.values()):
        try:
            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

            dims = read(SymbolicShapeInference.infer_shapes(m, auto_merge=True))
        except Exception:
            pass
    if any(not d or -1 in d for d in dims.values()) and all(-1 not in v for v in shapes.values()):
        dims = _run_for_dims(model, shapes) or dims
    return dims


def _run_for_dims(model, shapes: dict[str, list[int]]) -> dict[str, list[int]] | None:
    """Last resort for fixed input shapes (e.g. graphs with If nodes that neither inference sees through):
    run the model once on zeros. Zeros are valid for index inputs (row 0 exists), so only shapes matter."""
    try:
        import numpy as np
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        feeds = {i.name: np.zeros(shapes[i.name], _np_dtype(i.type.tensor_type.elem_type))
                 for i in _graph_inputs(model)}
        names = [o.name for o in sess.get_outputs()]
        return {n: list(v.shape) for n, v in zip(names, sess.run(None, feeds))}
    except Exception:
        return None


# ------------------------------------------------------------------------------------------- writing
def om_path(output: str, mode: str) -> Path:
    """Shape-range models are "root models" saved as <output>_linux_<arch>.om (ascend.md 1.1, GE-src)."""
    if mode == "shape_range":
        return Path(f"{output}_linux_{platform.machine()}.om")
    return Path(f"{output}.om")


def write_fake_om(path: Path, header: dict, model_path: str) -> None:
    data = json.dumps(header).encode("utf-8")
    # Real ATC's behaviour with a missing output folder is not documented; the fake creates it.
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<Q", len(data)) + data + Path(model_path).read_bytes())


def read_fake_om(path) -> tuple[dict, bytes]:
    """(header, ONNX bytes) of a fake OM file."""
    blob = Path(path).read_bytes()
    if not blob.startswith(MAGIC):
        raise ValueError(f"{path} is not a fake OM file")
    (size,) = struct.unpack("<Q", blob[len(MAGIC):len(MAGIC) + 8])
    start = len(MAGIC) + 8
    return json.loads(blob[start:start + size].decode("utf-8")), blob[start + size:]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print("ATC start working now, please wait for a moment.")
    try:
        opts = parse_argv(argv)
        header = check(opts)
        path = om_path(opts["output"], header["mode"])
        write_fake_om(path, header, opts["model"])
    except AtcFailure as exc:
        print(exc)
        print(FAILURE)
        return 1
    print(SUCCESS)
    return 0


def install_fake_atc(bin_dir) -> Path:
    """Write an executable ``atc`` into ``bin_dir`` that runs this module with this Python; returns its path."""
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[2]  # the directory holding the sam3track package
    path = bin_dir / "atc"
    path.write_text(f'#!/bin/sh\nPYTHONPATH="{root}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" '
                    f'-m sam3track.testing.fake_atc "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


if __name__ == "__main__":
    sys.exit(main())
