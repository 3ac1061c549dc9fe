"""full.md and scaling.png of benchmarks/full_size.py from its results.json:
`python -m benchmarks.full_size_report OUT` rewrites them from OUT/results.json."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

REFERENCE = "reference"


def _stat(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def _fmt(stat: dict | None, scale: float = 1.0, digits: int = 2) -> str:
    if stat is None:
        return "-"
    m, lo, hi = (stat[k] * scale for k in ("median", "min", "max"))
    return f"{m:,.{digits}f}" if lo == hi else f"{m:,.{digits}f} [{lo:,.{digits}f}-{hi:,.{digits}f}]"


def point(runs: list[dict]) -> dict:
    """One side at one count: every run's first frame, every timed frame (1..), peak RSS, tracked counts,
    and the errors of runs that failed."""
    ok = [r for r in runs if "error" not in r]
    return {"first_frame_ms": _stat([r["records"][0]["ms"] for r in ok]),
            "ms": _stat([f["ms"] for r in ok for f in r["records"][1:]]),
            "peak_rss_mb": _stat([r["peak_rss_mb"] for r in ok]),
            "load_s": _stat([r["load_s"] for r in ok]),
            "tracked": [[f["tracked"] for f in r["records"]] for r in ok],
            "errors": [r["error"] for r in runs if "error" in r]}


def summary(results: dict) -> dict:
    """side -> count -> point; plus the peak-RSS slope per object of each side (least squares over the
    counts it completed)."""
    points = {side: {n: point(runs) for n, runs in counts.items()} for side, counts in results["runs"].items()}
    slopes = {}
    for side, counts in points.items():
        xy = [(int(n), p["peak_rss_mb"]["median"]) for n, p in counts.items() if p["peak_rss_mb"]]
        if len({x for x, _ in xy}) >= 2:
            mx, my = statistics.mean(x for x, _ in xy), statistics.mean(y for _, y in xy)
            slopes[side] = sum((x - mx) * (y - my) for x, y in xy) / sum((x - mx) ** 2 for x, _ in xy)
    return {"points": points, "rss_mb_per_object": slopes}


def _header(r: dict) -> list[str]:
    m, s, b = r["machine"], r["settings"], r["bundle"]
    threads = f"{s['threads']} intra-op thread(s) on both sides" if s["threads"] else "each runtime's default threads"
    export = f"exported in {b['export_seconds']:.0f} s" if b.get("export_seconds") else "export found in the cache"
    lines = [f"# Full size: sam3track against transformers' Sam3VideoModel ({r['preset']} preset)", "",
             f"`{r['command']}`, {r['started']} to {r['finished'] or 'its last saved run'}.", "",
             f"**Machine:** {m['cpu_short']}, {m['cores']} cores, {float(m['ram_gb']):.0f} GB RAM; load average {m['load_start']} "
             f"at the start, {m.get('load_end') or '?'} at the end (a shared machine: compare sides within a run). "
             + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".", "",
             f"**Code:** commit {r['code']['commit']}{' (with changes)' if r['code']['dirty'] else ''}, graphs hash "
             f"{r['code']['graphs_hash']}.", "",
             f"**Model:** {(b.get('parameters') or 0) / 1e6:.0f} M parameters, seeded weights; {b['graphs_gb']} GB of "
             f"graphs, {export}.", "",
             f"**Runs:** {s['frames']} frames of `{s['clip']}` from frame {s['start_frame']}, prompts "
             f"{', '.join(map(repr, s['prompts']))}, {s['reps']} run(s) per side and count, interleaved; {threads}. "
             "Every run is a process of its own: it loads, runs frame 0 (the births: the first-frame latency) and "
             "the timed frames 1.., and its peak RSS (VmHWM) includes the load. Seconds per frame: median [min-max] "
             "over every timed frame of every run. Object counts are forced as in benchmarks/run.py (each side's "
             "detection threshold between its N-th and (N+1)-th first-frame score, max_num_objects = N, hotstart "
             "off, mask NMS and hole filling off on both sides)."]
    for side, chose in r.get("chose", {}).items():
        extra = ", ".join(f"{k}={v}" for k, v in chose.items() if k not in ("backend", "reason"))
        lines += ["", f"**{side}** ran {chose['backend']}{f' ({extra})' if extra else ''}: {chose.get('reason', '')}"]
    return lines


def _load_table(r: dict) -> list[str]:
    rows = ["## Load", "", "| side | cold load s | warm load s | RSS after a warm load MB |", "|---|---|---|---|"]
    for side, kinds in r["loads"].items():
        cells = []
        for kind in ("cold", "warm"):
            runs = kinds.get(kind, [])
            ok = [x["load_s"] for x in runs if "error" not in x]
            errors = [_cell(x["error"]) for x in runs if "error" in x]
            cells.append("; ".join(([_fmt(_stat(ok))] if ok else []) + [f"failed: {e}" for e in errors]) or "-")
        last = [x for x in kinds.get("warm", kinds.get("cold", [])) if "error" not in x]
        rss = _fmt(_stat([x["rss_after_load_mb"] for x in last]), digits=0)
        if side == REFERENCE:
            cells[1] = "- (from_pretrained: no cache)"
        rows.append(f"| {side} | {cells[0]} | {cells[1]} | {rss} |")
    return rows


def _counts_table(r: dict, summ: dict) -> list[str]:
    rows = ["## Per object count", "",
            "| objects | side | first frame s | s per frame (1..) | ours / reference | peak RSS MB | load s | tracked per frame |",
            "|---|---|---|---|---|---|---|---|"]
    sides = r["settings"]["variants"] + [REFERENCE]
    for n in map(str, r["settings"]["objects"]):
        ref = summ["points"].get(REFERENCE, {}).get(n)
        for side in sides:
            p = summ["points"].get(side, {}).get(n)
            if p is None:
                why = r.get("failed", {}).get(side, "the run stopped before this count")
                rows.append(f"| {n} | {side} | not measured: {_cell(why)} | | | | | |")
                continue
            if p["ms"] is None:
                rows.append(f"| {n} | {side} | failed: {_cell('; '.join(p['errors']))} | | | | | |")
                continue
            ratio = f"{p['ms']['median'] / ref['ms']['median']:.2f}" if side != REFERENCE and ref and ref["ms"] else ""
            tracked = "; ".join(" ".join(map(str, t)) for t in p["tracked"])
            if any(c != int(n) for t in p["tracked"] for c in t):
                tracked += " (differs from the count asked)"
            if p["errors"]:
                tracked += f"; {len(p['errors'])} more run(s) failed: {_cell('; '.join(p['errors']))}"
            rows.append(f"| {n} | {side} | {_fmt(p['first_frame_ms'], 1e-3)} | {_fmt(p['ms'], 1e-3)} | {ratio} | "
                        f"{_fmt(p['peak_rss_mb'], digits=0)} | {_fmt(p['load_s'])} | {tracked} |")
    return rows


def markdown(results: dict, image: str) -> str:
    summ = summary(results)
    lines = _header(results) + [""] + _load_table(results) + [""] + _counts_table(results, summ)
    lines += ["", "## Memory per object", ""]
    for side, slope in summ["rss_mb_per_object"].items():
        lines.append(f"- {side}: peak RSS grows {slope:,.0f} MB per object (least squares over the counts it completed)")
    if not summ["rss_mb_per_object"]:
        lines.append("- fewer than two counts completed: no slope")
    lines += ["", f"![time per frame and peak RSS against objects]({image})", ""]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = summary(results)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for side, counts in summ["points"].items():
        done = sorted((int(n), p) for n, p in counts.items() if p["ms"])
        if done:
            xs = [n for n, _ in done]
            left.plot(xs, [p["ms"]["median"] / 1e3 for _, p in done], marker="o", label=side)
            right.plot(xs, [p["peak_rss_mb"]["median"] / 1024 for _, p in done], marker="o", label=side)
    for ax, label in ((left, "seconds per frame (frames 1..)"), (right, "peak RSS, GiB")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("objects")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{results['preset']} preset, {results['machine']['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    loaded = json.loads((out / "results.json").read_text())
    (out / "full.md").write_text(markdown(loaded, image="scaling.png"))
    plot(loaded, out / "scaling.png")
