"""``sam3track info``: a bundle's manifest in brief (and an OM bundle's om_manifest.json), and the backends
that can run it."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from sam3track.commands.common import EXIT_ERROR, EXIT_OK, CliError, print_error


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _fmt_shape(shape: Any) -> str:
    if not isinstance(shape, list):
        return str(shape)
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _fmt_params(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "? parameters"
    if n >= 1e9:
        return f"{n / 1e9:.2f} B parameters"
    if n >= 1e6:
        return f"{n / 1e6:.1f} M parameters"
    return f"{int(n)} parameters"


def _short_hashes(value: Any) -> str:
    if isinstance(value, str):
        return value[:12]
    if isinstance(value, dict) and value:
        return ", ".join(f"{str(h)[:12]} ({name})" for name, h in value.items())
    return "unknown"


def _backends_lines() -> list[str]:
    """One line per backend sam3track has (sam3track/backends/): what it can use on this machine."""
    lines = []
    try:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
        lines.append(f"onnxruntime {onnxruntime.__version__}: providers {', '.join(providers)}")
    except Exception as e:  # not installed, or a broken build
        lines.append(f"onnxruntime: not available ({type(e).__name__}: {e}); pip install onnxruntime")
    try:
        import openvino

        from sam3track.backends.openvino import cpu_capabilities

        bf16 = "fp32 (default), bf16" if "BF16" in cpu_capabilities() else "fp32 (no bf16 on this CPU)"
        lines.append(f"openvino {openvino.__version__.split('-')[0]}: device cpu, precision {bf16}")
    except Exception as e:  # not installed, or a broken build
        lines.append(f"openvino: not available ({type(e).__name__}: {e}); pip install 'sam3track[openvino]'")
    try:
        import acl  # noqa: F401  pyacl, from the CANN toolkit

        lines.append("acl (Ascend OM bundles): pyacl found; run an OM bundle with backend='acl', device='npu:0'")
    except Exception:
        lines.append("acl (Ascend OM bundles): pyacl not found (it comes with the CANN toolkit: source set_env.sh); "
                     "convert a bundle with python -m om.convert")
    return lines


def _auto_line(manifest: dict) -> str:
    """What backend="auto" (the default) runs this bundle with on this machine's CPU, and why."""
    from sam3track.backend_choice import ENV_BACKEND, cached_verdict, cpu_candidates

    if os.environ.get(ENV_BACKEND, "auto") != "auto":
        return f"auto: ${ENV_BACKEND}={os.environ[ENV_BACKEND]}"
    if not cpu_candidates():
        return "auto (default): onnxruntime fp32 on cpu (no other CPU path installed)"
    verdict = cached_verdict(manifest)
    if verdict is None:
        return ("auto (default): not measured on this machine yet; the first load compares the installed CPU "
                "paths with onnxruntime fp32 on a 3-frame clip (once) and keeps the fastest within tolerance")
    label = verdict.backend + "".join(f" {k}={v}" for k, v in sorted(verdict.options.items()))
    return f"auto (default): {label} on cpu; {verdict.reason}"


def _fmt_axes(axes: Any) -> str:
    if not isinstance(axes, dict) or not axes:
        return "no dynamic axes"
    return " ".join(f"{a}={','.join(str(v) for v in sizes)}" + (" (fixed)" if len(sizes) == 1 else "")
                    for a, sizes in axes.items() if isinstance(sizes, list))


def _om_lines(bundle: Path, om: dict) -> list[str]:
    """The OM bundle's om_manifest.json (python -m om.convert): per graph its ATC mode, sizes and .om file."""
    graphs = om.get("graphs") if isinstance(om.get("graphs"), dict) else {}
    compiled = [g for g in graphs.values() if isinstance(g, dict) and g.get("om_file")]
    state = (f"compiled ({len(compiled)}/{len(graphs)} graphs)" if om.get("compiled")
             else "planned, not compiled (run atc/*.atc.sh on a CANN host, or convert with atc on PATH)")
    lines = [f"om bundle       soc {om.get('soc_version', '?')}, CANN {om.get('cann_version') or 'unknown'}, {state}"]
    for name, g in graphs.items():
        g = g if isinstance(g, dict) else {}
        om_file = g.get("om_file")
        where = "planned, not compiled"
        if om_file:
            where = om_file + ("" if (bundle / om_file).is_file() else "  MISSING")
        lines.append(f"  {name:<22} {g.get('mode', '?'):<13} {g.get('precision', '?'):<14} {where}")
        lines.append(f"      axes {_fmt_axes(g.get('axes'))}")
        profiles = g.get("profiles")
        if isinstance(profiles, list) and g.get("mode") == "dynamic_dims":
            lines.append(f"      {len(profiles)} --dynamic_dims profiles")
        if g.get("risky_ops"):
            lines.append("      risky ops " + ", ".join(f"{op} x{n}" for op, n in g["risky_ops"].items()))
    return lines


def _read_manifest(bundle: Path) -> dict:
    """The bundle's manifest; CliError naming the folder or file at fault."""
    manifest_path = bundle / "manifest.json"
    if not bundle.exists():
        raise CliError(f"bundle folder not found: {bundle}")
    if not bundle.is_dir():
        raise CliError(f"{bundle} is a file; pass a bundle folder")
    if not manifest_path.is_file():
        raise CliError(
            f"{bundle} is not a bundle: it has no manifest.json; export one with "
            f"python -m graphs.export --checkpoint SNAPSHOT --out {bundle}"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CliError(f"{manifest_path} is not valid JSON ({e}); export the bundle again")
    except OSError as e:
        raise CliError(f"cannot read {manifest_path}: {e}") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("graphs"), dict):
        raise CliError(f"{manifest_path} lists no graphs; export the bundle again")
    return manifest


def _header_lines(bundle: Path, manifest: dict) -> list[str]:
    """Where the bundle is, its family and format, the checkpoint it came from and the exporter."""
    source = manifest.get("source") or {}
    lines = [f"bundle          {bundle.resolve()}"]
    family = manifest.get("family", "sam3")
    lines.append(f"family          {family}" + (" (Meta's multiplex tracker: buckets of 16 objects)"
                                                   if family == "sam3.1" else ""))
    lines.append(
        f"format version  {manifest.get('format_version', '?')}"
        + (f" (created {manifest['created']})" if manifest.get("created") else "")
    )
    src = [str(source.get("model_type", "unknown model")), _fmt_params(source.get("parameters"))]
    src.append(f"weights sha256 {_short_hashes(source.get('weights_sha256'))}")
    if source.get("tiny_seed") is not None:
        src.append(f"tiny seed {source['tiny_seed']}: RANDOM weights")
    lines.append("source          " + ", ".join(src))
    exporter = manifest.get("exporter") or {}
    if exporter:
        lines.append(
            "exported with   " + ", ".join(f"{k} {v}" for k, v in exporter.items()
                                           if k != "export_seconds")
        )
    return lines


def _graph_lines(bundle: Path, graphs: dict) -> list[str]:
    """One line per graph (size, precision, files, what is missing), then its tensors."""
    lines = [f"graphs          {len(graphs)}"]
    for name, g in graphs.items():
        g = g if isinstance(g, dict) else {}
        files = [g.get("file", f"{name}.onnx"), *(g.get("data_files") or [])]
        missing = [f for f in files if not (bundle / f).is_file()]
        size = g.get("bytes")
        if not isinstance(size, (int, float)):
            size = sum((bundle / f).stat().st_size for f in files if (bundle / f).is_file())
        status = f"  MISSING {', '.join(missing)}" if missing else ""
        lines.append(
            f"  {name:<22} {_fmt_bytes(size):>9}  {g.get('precision', '?'):<5} "
            f"{', '.join(files)}{status}"
        )
        for kind, key in (("in ", "inputs"), ("out", "outputs")):
            for t in g.get(key) or []:
                lines.append(
                    f"      {kind} {t.get('name', '?'):<28} {t.get('dtype', '?'):<8} "
                    f"{_fmt_shape(t.get('shape'))}"
                )
    return lines


def _read_om_manifest(om_path: Path) -> dict:
    try:
        om = json.loads(om_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise CliError(f"{om_path} cannot be read ({e}); convert the bundle again with python -m om.convert")
    if not isinstance(om, dict):
        raise CliError(f"{om_path} holds no JSON object; convert the bundle again with python -m om.convert")
    return om


def cmd_info(args: argparse.Namespace) -> int:
    bundle = Path(args.bundle)
    try:
        manifest = _read_manifest(bundle)
        if args.verify:
            _verify(bundle)
        lines = _header_lines(bundle, manifest) + _graph_lines(bundle, manifest["graphs"])
        om_path = bundle / "om_manifest.json"
        if om_path.is_file():
            lines.extend(_om_lines(bundle, _read_om_manifest(om_path)))
    except CliError as e:
        print_error(str(e))
        return EXIT_ERROR
    lines.append("checksums       " + ("verified (every graph and tokenizer file matches the manifest's sha256)"
                                     if args.verify else "not verified (sam3track info --verify BUNDLE checks them)"))
    lines.append("backends")
    lines.extend(f"  {line}" for line in _backends_lines())
    lines.append(f"  {_auto_line(manifest)}")
    print("\n".join(lines))
    return EXIT_OK


def _verify(bundle: Path) -> None:
    """Every file the manifest lists, against its sha256 (what loading the bundle checks): CliError naming
    the first file that is missing or differs."""
    from sam3track.bundle import Bundle
    from sam3track.errors import BundleError

    try:
        Bundle.open(bundle, verify=True)
    except BundleError as e:
        raise CliError(str(e)) from e


def add_parser(sub) -> argparse.ArgumentParser:
    """``sam3track info`` and its argument, on the CLI's subparsers."""
    info = sub.add_parser(
        "info",
        help="describe a bundle: source, graphs, tensors and the backends that can run it",
        description="Print a bundle's manifest in brief.",
    )
    info.add_argument("bundle", type=Path, metavar="BUNDLE", help="bundle folder")
    info.add_argument("--verify", action="store_true",
                      help="check every graph and tokenizer file against the manifest's sha256 (reads every "
                           "byte: seconds for a full-size bundle); exits 2 naming the first file that differs")
    info.set_defaults(func=cmd_info)
    return info
