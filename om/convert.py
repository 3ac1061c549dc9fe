"""Convert a sam3track bundle into an OM bundle: ATC-ready ONNX, atc command lines and, with CANN, .om files.

    python -m om.convert BUNDLE --soc Ascend910B2 [--out OM_BUNDLE] [--overwrite]
        [--precision MODE | --precision GRAPH=MODE ...] [--gears AXIS=N,N,... ...] [--shape-range GRAPH ...]

Without atc on PATH the bundle is complete but "planned, not compiled": run atc/<graph>.atc.sh on a CANN
host, or convert there. Layout and manifest: /work/notes/om-contract.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from sam3track.atomic_files import replace_directory
from sam3track.bundle import Bundle, file_sha256
from sam3track.errors import Sam3TrackError

from . import atc as atc_mod
from .atc_rules import BF16_SOCS, soc_problem
from . import manifest as manifest_mod
from .errors import ConversionError
from . import sam31
from .plan import (DEFAULT_GEARS, GraphPlan, axes_of, default_gears, family, graph_gears, parse_gears,
                   plan_graph)
from .prepass import make_atc_ready

PRECISION_HELP = (
    "ATC --precision_mode_v2 for every graph (MODE) or one graph (GRAPH=MODE); repeatable. MODE: origin "
    "(default: keeps fp32, parity with onnxruntime), fp16, mixed_float16, mixed_bfloat16 (910B only). "
    "text_encoder is known to be fp16-sensitive: keep it at origin unless its parity was checked.")


def parse_precision(items: list[str], graphs: list[str]) -> dict[str, str]:
    """["fp16", "text_encoder=origin"] -> {graph: mode}; a bare MODE sets every graph not named explicitly."""
    default, named = "origin", {}
    for item in items:
        graph, sep, mode = item.rpartition("=")
        if mode not in atc_mod.PRECISIONS:
            raise ConversionError(f"--precision {item!r}: {mode!r} is not a precision; choose from "
                                  f"{', '.join(atc_mod.PRECISIONS)}")
        if not sep:
            default = mode
        elif graph not in graphs:
            raise ConversionError(f"--precision {item!r}: no graph {graph!r}; the bundle has {', '.join(graphs)}")
        else:
            named[graph] = mode
    return {g: named.get(g, default) for g in graphs}


def make_plans(manifest: dict, gears: dict[str, tuple[int, ...]] | None = None, shape_range=(),
               precision: dict[str, str] | None = None) -> dict[str, GraphPlan]:
    """Plan every graph of a source manifest: the default gears and capacities, overridden by ``gears``."""
    graphs = manifest["graphs"]
    unknown = [g for g in shape_range if g not in graphs]
    if unknown:
        raise ConversionError(f"--shape-range names unknown graphs {unknown}; the bundle has {', '.join(graphs)}")
    all_gears = default_gears(manifest)
    all_gears.update(gears or {})
    explicit = set(gears or {})
    fam = family(manifest)
    rules = sam31.ALLOWED if fam == sam31.FAMILY else {}
    plans = {name: plan_graph(name, entry, graph_gears(name, all_gears, explicit, fam), shape_range=name in shape_range,
                              precision=(precision or {}).get(name, "origin"), allowed=rules.get(name))
             for name, entry in graphs.items()}
    if fam == sam31.FAMILY:
        for name, plan in plans.items():
            plan.notes.extend(sam31.notes(plan))
    return plans


def _checked_source(bundle: Path, soc: str, out: Path, overwrite: bool) -> Bundle:
    """The source bundle, once the SoC, the destination and the bundle's attention form are fine."""
    if not soc:
        raise ConversionError("--soc is required: 'Ascend' + the Chip Name npu-smi info shows (e.g. Ascend910B2)")
    if soc_problem(soc):
        raise ConversionError(f"--soc {soc_problem(soc)}")
    if out.exists() and not overwrite:
        raise ConversionError(f"{out} already exists; pass --overwrite to replace it or choose another --out")
    source = Bundle.open(bundle)  # refuses a broken or changed bundle (either family) before any work
    manifest = source.manifest
    fused = [name for name, entry in manifest["graphs"].items() if entry.get("attention") == "fused"]
    if fused:
        raise ConversionError(
            f"{bundle}: {', '.join(fused)} use ONNX Runtime's fused attention op (com.microsoft MultiHeadAttention), "
            "which ATC cannot parse; export the bundle again with standard ops for Ascend: "
            f"python -m graphs.export{' --family sam3.1' if family(manifest) == sam31.FAMILY else ''} ... "
            "--attention plain")
    return source


def convert_bundle(bundle: Path, soc: str, out: Path, *, gears: dict[str, tuple[int, ...]] | None = None,
                   precision: dict[str, str] | None = None, shape_range=(), overwrite: bool = False,
                   atc: str | None = "auto", log=print, atc_log: str = "error", atc_log_dir: Path | None = None) -> dict:
    """Build the OM bundle at ``out``; returns its om_manifest. ``atc``: path of atc, None to only plan,
    "auto" to use the one on PATH if any. ``atc_log``: ATC's --log level; ``atc_log_dir``: where each
    graph's atc output is kept (<graph>.atc.log)."""
    bundle, out = Path(bundle), Path(out).absolute()
    source = _checked_source(bundle, soc, out, overwrite)
    manifest = source.manifest
    plans = make_plans(manifest, gears, shape_range, precision)
    # ascend.md 1.3: mixed_bfloat16 is for A2/910B only. [unconfirmed] which other SoCs accept it: warn, not refuse.
    bf16 = [g for g, p in plans.items() if p.precision == "mixed_bfloat16"]
    if bf16 and soc not in BF16_SOCS:
        log(f"warning: {', '.join(bf16)}: mixed_bfloat16 is documented for 910B (A2) only, not {soc}")
    if atc == "auto":
        atc = atc_mod.find_atc()

    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)  # a previous run's leftovers: never a finished bundle
    staging.mkdir(parents=True)
    try:
        entries, onnx_files = {}, {}
        for name, plan in plans.items():
            onnx_rel = f"onnx/{name}.onnx"
            report = make_atc_ready(source.graph_path(name), plan, manifest, staging / onnx_rel)
            for w in report.warnings:
                log(f"warning: {w}")
            onnx_files[name] = [onnx_rel] + [f"onnx/{d}" for d in report.data_files]
            argv = atc_mod.atc_command(plan, soc, onnx_rel, f"om/{name}", atc_log)
            script = f"atc/{name}.atc.sh"
            atc_mod.write_script(staging / script, argv)
            log_file = Path(atc_log_dir) / f"{name}.atc.log" if atc_log_dir else None
            om_file = atc_mod.run_atc(argv, staging, name, atc, log_file) if atc else None
            src_file = manifest["graphs"][name]["file"]
            entries[name] = manifest_mod.graph_entry(
                plan, src_file, file_sha256(bundle / src_file), onnx_rel, file_sha256(staging / onnx_rel),
                argv, script, om_file, report.risky_ops, report.check_sizes)
            axes = " ".join(f"{a}={','.join(map(str, s))}" for a, s in plan.axes.items()) or "-"
            log(f"{name:<20} {plan.mode:<13} {plan.precision:<14} {axes}  -> {om_file or 'planned, not compiled'}")
        tok = manifest["tokenizer"]["dir"]
        shutil.copytree(bundle / tok, staging / tok)
        (staging / "manifest.json").write_text(
            json.dumps(manifest_mod.bundle_manifest(manifest, staging, onnx_files), indent=2))
        om = manifest_mod.om_manifest(soc, atc_mod.cann_version(), bundle / "manifest.json", entries,
                                      family(manifest))
        (staging / "om_manifest.json").write_text(json.dumps(om, indent=2))
        replace_directory(staging, out)  # --overwrite: the old bundle goes only once the new one is complete
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if om["compiled"]:
        log(f"OM bundle written to {out} (compiled for {soc})")
    else:
        log(f"OM bundle written to {out}: planned, not compiled (atc is not on PATH; source CANN's set_env.sh "
            f"and convert again, or run {out}/atc/*.atc.sh on a CANN host)")
    return om


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m om.convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path, help="sam3track bundle (python -m graphs.export)")
    parser.add_argument("--soc", required=True, help="ATC --soc_version: 'Ascend' + npu-smi's Chip Name, "
                                                     "e.g. Ascend910B2")
    parser.add_argument("--out", type=Path, help="OM bundle to create (default: BUNDLE-om)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--precision", action="append", nargs="+", default=[], metavar="MODE|GRAPH=MODE",
                        help=PRECISION_HELP)
    defaults = " ".join(f"{a}={','.join(map(str, s))}" for a, s in DEFAULT_GEARS.items())
    parser.add_argument("--gears", nargs="+", default=[], metavar="AXIS=N,N",
                        help=f"sizes to compile per axis (default {defaults}; the propagation_decoder's memories, "
                             "pointers, memory_rows and pointer_rows are fixed at capacities from the bundle's "
                             "config, om.plan.default_capacities; interactive_decoder runs one object and keeps "
                             "its pool axes at their largest size; "
                             "a SAM 3.1 bundle adds buckets=1,2,4 and mask_side=14F,16F, fixes memories, pointers "
                             "and the pool rows at om.sam31.capacities, runs grounding_head's rows (images = "
                             "prompts) at the prompt gears, memory_encoder one bucket and box_grounding_head one "
                             "image). One size fixes an axis; more make it vary. --dynamic_dims profiles take at "
                             "most 4 values: vary few axes of a graph whose axes sit beyond dim 0.")
    parser.add_argument("--shape-range", nargs="+", default=[], metavar="GRAPH",
                        help="compile these graphs in shape-range mode (lo~hi dims, 910B/310P only) instead of gears")
    args = parser.parse_args(argv)
    out = args.out or args.bundle.resolve().with_name(args.bundle.resolve().name + "-om")
    try:
        manifest = Bundle.open(args.bundle, verify=False).manifest
        known = {a for entry in manifest["graphs"].values() for a in axes_of(entry)}
        gears = parse_gears(args.gears, known)
        precision = parse_precision([p for group in args.precision for p in group], list(manifest["graphs"]))
        convert_bundle(args.bundle, args.soc, out, gears=gears, precision=precision,
                       shape_range=tuple(args.shape_range), overwrite=args.overwrite)
    except Sam3TrackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
