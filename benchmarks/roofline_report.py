"""The roofline's report: results.json -> roofline.md and roofline.png (``python -m benchmarks.roofline``
writes them after a run, and again from a results.json with ``--report``). It also names what is reported:
the graphs, the runtimes' labels and precisions, and the target fraction of the roofline."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np

from benchmarks.graph_speed import NO_FLAGS

GRAPHS = ("backbone", "text_encoder", "grounding_head", "propagation_decoder", "memory_encoder")
PER_OBJECT = ("propagation_decoder", "memory_encoder", "interactive_decoder", "mask_init")
RUNTIMES = ("ort", "ov-f32", "ov-bf16", "ov-bf16-static")
PRECISION = {"ort": "fp32", "ov-f32": "fp32", "ov-bf16": "bf16", "ov-f32-static": "fp32", "ov-bf16-static": "bf16"}
LABEL = {"ort": "ONNX Runtime fp32", "ov-f32": "OpenVINO f32", "ov-bf16": "OpenVINO bf16",
         "ov-f32-static": "OpenVINO f32 static", "ov-bf16-static": "OpenVINO bf16 static"}
TARGET = 1 / 1.5  # the target: within 1.5x of the roofline


def _num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}" if abs(x) >= 10 or digits == 0 else f"{x:.{max(digits, 2)}f}"


CLOCKS = {"cpu": "achieved GFLOP/s and the peaks are from process CPU time (one thread: the CPU time of a "
                   "call is its time on a core, leaving out the time it waited, descheduled, while other jobs "
                   "ran; on a quiet machine the two clocks agree). Wall-clock times are listed too.",
          "wall": "achieved GFLOP/s and the peaks are from wall-clock time (more than one thread: process CPU "
                  "time would sum the threads)."}


def markdown(r: dict) -> str:
    m, s = r["machine"], r["settings"]
    lines = ["# Roofline: sam3track's graphs against this CPU's measured peaks", "",
             f"`{r['command']}`, {r['started']} to {r['finished']}.", "",
             f"**Machine:** {m['cpu']}, {m['cores']} cores, CPU flags {' '.join(m['flags']) or NO_FLAGS}; "
             f"load average {m['load_start']} at the start, {m['load_end']} at the end (a shared machine: other jobs "
             "ran beside this one, so every time here is an upper bound of the quiet machine's). "
             + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".", "",
             f"**Calls:** bundle `{s['bundle']}`; per-object graphs at {', '.join(map(str, s['objects']))} objects, "
             f"each reading {s['memories']} memories and {s['pointers']} object pointers; the others once per call "
             f"(one image, one prompt). Runtime by runtime (each one's peaks measured just before its calls), "
             f"{s['reps']} repetitions interleaved over its cases after a warm-up call each, threads: "
             f"{s['threads'] or 'each runtime default'}.", ""]
    clock = s.get("clock", "wall")
    lines += [f"**Clock:** {CLOCKS[clock]}", ""]
    lines += _peak_table(r, clock)
    bw = r["bandwidth"]
    lines += ["", f"Memory bandwidth: **{bw['gbps']} GB/s** (best of a numpy copy, {bw['numpy_copy']} GB/s, and an "
              f"ONNX Runtime Add, {bw['ort_add']} GB/s, over {bw['mib']} MiB; read + write bytes). Ridge points: "
              + ", ".join(f"{LABEL[rt]} {r['peaks'][rt] / bw['gbps']:.0f} FLOP/B" for rt in s["runtimes"]
                          if r["peaks"].get(rt)) + ".", ""]
    lines += _table(r["rows"], s["runtimes"])
    lines += _profile_table(r["rows"])
    lines += _op_rates(r)
    return "\n".join(lines) + "\n"


CLOCK_NAMES = {"cpu": "process CPU time", "wall": "wall clock"}


def _peak_table(r: dict, clock: str) -> list[str]:
    """Each runtime's MatMul and convolution GFLOP/s and the peak the rows are held to (the higher by the
    run's clock); results.json files from before the convolution have none (the MatMul is the peak)."""
    kinds = [("matmul", "MatMul " + "x".join(map(str, r["matmul"]["shape"])))]
    if "conv" in r:
        kinds.append(("conv", "Conv 3x3 " + "x".join(map(str, r["conv"]["shape"]))))
    head = " | ".join(f"{name}: best by CPU time | best by wall clock | median by wall clock" for _, name in kinds)
    lines = ["## Peaks (measured in this run, through the same runtimes, before each runtime's calls)", "",
             f"GFLOP/s. The peak each row is held to: the higher of these by {CLOCK_NAMES[clock]}.", "",
             f"| runtime | precision | {head} | peak |", "|---|---|" + "---|---|---|" * len(kinds) + "---|"]
    for rt in r["settings"]["runtimes"]:
        cells = []
        for kind, _ in kinds:
            got = r[kind].get(rt, {})
            cells += [got.get("cpu_gflops", got.get("unavailable", "-")), got.get("wall_gflops", "-"),
                      got.get("median_wall_gflops", "-")]
        lines.append(f"| {LABEL[rt]} | {PRECISION[rt]} | " + " | ".join(map(str, cells))
                     + f" | {_num(r['peaks'].get(rt))} |")
    return lines


def _table(rows: list[dict], runtimes: list[str]) -> list[str]:
    lines = ["## Every graph and call size", "",
             "GEMM GFLOP: the call's MatMul/Gemm/Conv/attention FLOPs (what the roofline counts); other: element-wise, "
             "softmax and norm FLOPs, apart; MB: weights + inputs + outputs, a lower bound on the bytes moved. "
             "Achieved: GEMM FLOPs over the median time by the run's clock (above). Fraction: achieved / min(peak, "
             "intensity x bandwidth); the target is >= 0.67 (within 1.5x).", "",
             "| graph | size | runtime | GEMM GFLOP | other GFLOP | MB moved | FLOP/B | wall ms median [min-max] | "
             "CPU ms median [min-max] | achieved GFLOP/s | roofline GFLOP/s | fraction |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {rt: i for i, rt in enumerate(runtimes)}
    for row in sorted(rows, key=lambda x: (GRAPHS.index(x["graph"]) if x["graph"] in GRAPHS else 99, x["size"],
                                           order[x["runtime"]])):
        frac = row["fraction"]
        mark = "" if frac is None else (" **ok**" if frac >= TARGET else "")
        lines.append(f"| {row['graph']} | {row['size']} | {LABEL[row['runtime']]} | {_num(row['gemm_gflop'], 2)} | "
                     f"{_num(row['other_gflop'], 3)} | {_num(row['bytes_mb'], 1)} | {_num(row['intensity'])} | "
                     f"{_num(row['median_ms'], 1)} [{_num(row['min_ms'], 1)}-{_num(row['max_ms'], 1)}] | "
                     f"{_num(row.get('cpu_median_ms'), 1)} [{_num(row.get('cpu_min_ms'), 1)}-"
                     f"{_num(row.get('cpu_max_ms'), 1)}] | {_num(row['achieved_gflops'], 1)} | {_num(row['roofline_gflops'])} | "
                     f"{'-' if frac is None else f'{frac:.2f}'}{mark} |")
    return lines + [""]


ORT_FUSED = {"FusedMatMul": "MatMul", "FusedConv": "Conv"}  # ONNX Runtime's fused kernels -> the graph's op


def _op_rates(r: dict) -> list[str]:
    """ONNX Runtime only (its kernels keep the graph's op types): GFLOP/s of each GEMM-class op type, its
    counted FLOPs over its profiled time."""
    counts = {(c["graph"], c["size"]): c["by_op"] for c in r["counts"]}
    lines = []
    for row in r["rows"]:
        if row["runtime"] != "ort" or "profile" not in row:
            continue
        ms = collections.Counter()
        for op, t in row["profile"]["top_ops_ms"].items():
            ms[ORT_FUSED.get(op, op)] += t
        by_op = counts[(row["graph"], row["size"])]
        rates = [f"{op} {by_op[op]['gemm'] / 1e9:.1f} GFLOP in {ms[op]:,.0f} ms = "
                 f"{by_op[op]['gemm'] / (ms[op] / 1000) / 1e9:.0f} GFLOP/s"
                 for op in sorted(by_op, key=lambda o: -by_op[o]["gemm"]) if by_op[op]["gemm"] and ms.get(op)]
        if rates:
            lines.append(f"| {row['graph']} | {row['size']} | " + "; ".join(rates) + " |")
    if not lines:
        return []
    return ["## ONNX Runtime: GFLOP/s of each GEMM-class op type", "",
            "Counted FLOPs of the op type over its profiled kernel time (fused MatMul/Conv kernels counted as "
            f"their op; the peak: {_num(r['peaks'].get('ort'))} GFLOP/s).", "",
            "| graph | size | op types |", "|---|---|---|", *lines, ""]


def _profile_table(rows: list[dict]) -> list[str]:
    profiled = [r for r in rows if "profile" in r]
    if not profiled:
        return []
    lines = ["## Where the time goes (profiled calls)", "",
             "Shares of the profiled kernel time: GEMM-class kernels (MatMul, FullyConnected, Conv, ONNX Runtime's "
             "MultiHeadAttention), OpenVINO's fused `Subgraph`s (Snippets: element-wise chains, and attention blocks "
             "with their two products), layout copies (Transpose, Concat, Gather, Reorder, Convert ...) and the rest "
             "(element-wise, norms, softmax); per op type the median of the profiled calls. GEMM kernels' GFLOP/s: "
             "the GEMM FLOPs over the profiled time of the GEMM-class kernels and fused subgraphs (profiling adds "
             "its own overhead, so this is a rough figure).", "",
             "| graph | size | runtime | GEMM share | fused share | copy share | other share | "
             "GEMM kernels' GFLOP/s (of peak) | top ops, ms | GEMM and fused kernels, ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in sorted(profiled, key=lambda x: (x["graph"], x["size"], x["runtime"])):
        p, g = row["profile"], row.get("gemm_kernel_gflops")
        of_peak = f" ({g / row['peak_gflops']:.2f})" if g and row["peak_gflops"] else ""
        top = ", ".join(f"{k} {v:,.1f}" for k, v in list(p["top_ops_ms"].items())[:4])
        kernels = ", ".join(f"{k} {v:.1f}" for k, v in list(p["gemm_kernels_ms"].items())[:3]) or "-"
        lines.append(f"| {row['graph']} | {row['size']} | {LABEL[row['runtime']]} | {p['shares']['gemm']:.2f} | "
                     f"{p['shares'].get('fused', 0):.2f} | {p['shares']['copy']:.2f} | {p['shares']['other']:.2f} | {_num(g, 1)}{of_peak} | {top} | "
                     f"{kernels} |")
    return lines + [""]


COLOURS = {"ort": "#4c72b0", "ov-f32": "#55a868", "ov-bf16": "#c44e52", "ov-bf16-static": "#dd8452",
           "ov-f32-static": "#8172b3"}
MARKERS = {"backbone": "s", "text_encoder": "^", "grounding_head": "D", "propagation_decoder": "o",
           "memory_encoder": "v", "interactive_decoder": "P", "mask_init": "X"}


def plot(r: dict, path: Path) -> None:
    """Log-log roofline: one line per runtime (its peak, the measured bandwidth), one point per graph,
    call size and runtime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, bw = r["rows"], r["bandwidth"]["gbps"]
    fig, ax = plt.subplots(figsize=(13, 6.5))
    xs = np.logspace(np.log10(max(0.5, min(x["intensity"] for x in rows) / 2)),
                     np.log10(max(x["intensity"] for x in rows) * 3), 200)
    for rt in r["settings"]["runtimes"]:
        peak = r["peaks"].get(rt)
        if peak:
            ax.plot(xs, np.minimum(peak, xs * bw), color=COLOURS.get(rt, "k"), lw=1.5, alpha=0.7,
                    label=f"roofline {LABEL[rt]} ({peak:.0f} GFLOP/s, {bw:.0f} GB/s)")
    for row in rows:
        ax.scatter(row["intensity"], row["achieved_gflops"], color=COLOURS.get(row["runtime"], "k"),
                   marker=MARKERS.get(row["graph"], "o"), s=40, zorder=3)
        if row["graph"] in PER_OBJECT:
            ax.annotate(str(row["size"]), (row["intensity"], row["achieved_gflops"]), fontsize=7,
                        xytext=(4, 2), textcoords="offset points")
    for graph in sorted({x["graph"] for x in rows}):
        ax.scatter([], [], color="grey", marker=MARKERS.get(graph, "o"), label=graph.replace("_", " "))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity, GEMM FLOPs per byte (weights + inputs + outputs)")
    clock = "CPU" if r["settings"].get("clock") == "cpu" else "wall-clock"
    ax.set_ylabel(f"achieved GFLOP/s (GEMM FLOPs / median {clock} time)")
    ax.set_title(f"Roofline, {r['settings']['bundle']} ({r['machine']['cpu']}, {r['machine']['cores']} cores); "
                 "numbers: objects", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(r: dict, out: Path) -> None:
    (out / "roofline.md").write_text(markdown(r))
    plot(r, out / "roofline.png")
