"""results.json -> results.md (markdown tables) and the two plots (ms_per_frame.png, breakdown.png)."""

from __future__ import annotations

from pathlib import Path

# One colour per kind of work, shared by both sides so the stacked bars compare like with like.
KINDS = {  # category -> (label, colour)
    "graph:backbone": ("backbone", "#4c72b0"), "backbone": ("backbone", "#4c72b0"),
    "graph:text_encoder": ("text encoder", "#8172b3"), "text_encoder": ("text encoder", "#8172b3"),
    "graph:grounding_head": ("detector heads", "#64b5cd"), "detector_heads": ("detector heads", "#64b5cd"),
    "graph:propagation_decoder": ("tracker: propagation", "#c44e52"), "tracker": ("tracker (all calls)", "#c44e52"),
    "graph:mask_init": ("tracker: new objects", "#dd8452"),
    "graph:interactive_decoder": ("tracker: clicks", "#937860"),
    "graph:memory_encoder": ("memory encoder", "#55a868"), "memory_encoder": ("memory encoder", "#55a868"),
    "preprocess": ("preprocessing", "#ccb974"),
    "results": ("results / postprocessing", "#da8bc3"), "postprocess": ("results / postprocessing", "#da8bc3"),
    "copies": ("host<->device copies", "#8c8c8c"),
    "python": ("Python outside graphs / rest", "#dddddd"),
}


def _fmt(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}"


def _span(stat: dict | None) -> str:
    if not stat:
        return "-"
    return f"{_fmt(stat['median'])} [{_fmt(stat['min'])}-{_fmt(stat['max'])}]"


def _counts(entry: dict | None) -> str:
    if not entry:
        return "-"
    seen = sorted({c for rep in entry["tracked"] for c in rep})
    return "/".join(map(str, seen))


def _detected(entry: dict | None) -> str:
    """min-max of the detections per frame over frames 1.. of every repetition."""
    if not entry or not entry.get("detections"):
        return "-"
    seen = [c for rep in entry["detections"] for c in rep[1:] if c is not None]
    if not seen:
        return "-"
    return f"{min(seen)}" if min(seen) == max(seen) else f"{min(seen)}-{max(seen)}"


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def markdown(r: dict) -> str:
    objects = [str(n) for n in r["settings"]["objects"]]
    lines = _header(r)
    lines += _time_per_frame(r, objects)
    lines += _where_time_goes(r, objects)
    lines += _variants(r, objects)
    lines += _best_against_best(r, objects)
    lines += _fidelity(r)
    lines += _rss(r)
    return "\n".join(lines) + "\n"


def _header(r: dict) -> list[str]:
    """Title, command, machine, code, model and how the run was made."""
    m, s = r["machine"], r["settings"]
    lines = [f"# sam3track vs transformers' Sam3VideoModel: `{r['preset']}` preset", ""]
    lines += [f"`{r['command']}`, {r['started']} to {r['finished']}.", ""]
    lines += [f"**Machine:** {m['cpu']}, {m['cores']} cores, {m['ram_gb']:.0f} GB RAM, "
              f"CPU flags {', '.join(m.get('isa', [])) or 'unknown'}; "
              f"load average {m['load_start']} at the start, {m['load_end']} at the end (a shared machine: "
              "other jobs ran beside this one, so compare sides within a run, not across runs). "
              + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".", ""]
    code = r.get("code")
    if code:
        lines += [f"**Code:** commit {code['commit']}{' with uncommitted changes' if code['dirty'] else ''}, "
                  f"graphs/**/*.py hash {code['graphs_hash']}.", ""]
    lines += [f"**Model:** {r['model']}", ""]
    lines += [f"**Run:** {s['frames']} frames of `{s['clip']}` from frame {s['start_frame']} "
              f"({s['video_size']}), prompts {', '.join(repr(p) for p in s['prompts'])}; {s['reps']} repetitions per "
              f"side and object count, interleaved (ours, reference, ours, ...), after one {s['warmup_frames']}-frame "
              f"warm-up each. ms/frame is the mean over frames 1..{s['frames'] - 1} of a repetition (every object "
              "is born on frame 0, reported apart), given as the median over repetitions [min-max]. Both sides get "
              "the same pixel values (sam3track's preprocessing) and token ids. " + s["threads"], ""]
    lines += ["**Object counts** " + s["counts_method"], ""]
    lines += ["**Mask NMS and hole filling** " + s["nms"], ""]
    lines += ["**What is timed.** Ours: `propagate()` from RGB frames to results at video resolution "
              "(preprocessing and result building included). Reference: `propagate_in_video_iterator` on ready "
              "pixel values plus its processor's `postprocess_outputs` per frame (masks at video resolution). "
              "\"Model only\" leaves out preprocessing and result building (ours) and postprocessing (reference).", ""]
    return lines


def _time_per_frame(r: dict, objects: list[str]) -> list[str]:
    """The main table (ours ort-fp32 against the reference), the slopes, count warnings and the plots."""
    ours, ref = r["summary"].get("ort-fp32", {}), r["summary"].get("reference", {})
    lines = ["## Time per frame", ""]
    lines += ["| objects | ours (ort-fp32) ms/frame | reference ms/frame | ratio ours/ref | model only: ours / ref ms (ratio) "
              "| frame 0 (births) ours / ref ms | objects tracked per frame, ours / ref | detections per frame 1.., ours / ref |",
              "|---|---|---|---|---|---|---|---|"]
    for n in objects:
        o, f = ours.get(n), ref.get(n)
        ratio = r["ratios"].get("ort-fp32", {}).get(n)
        mratio = r["model_ratios"].get("ort-fp32", {}).get(n)
        model = (f"{_fmt(o['model_ms']['median'])} / {_fmt(f['model_ms']['median'])} ({mratio:.2f})"
                 if o and f and mratio is not None else "-")
        first = f"{_fmt(o['first_frame_ms'])} / {_fmt(f['first_frame_ms'])}" if o and f else "-"
        flag = "" if (o and f and o["counts_ok"] and f["counts_ok"]) else " **(differ from asked)**"
        lines.append(f"| {n} | {_span(o and o['ms'])} | {_span(f and f['ms'])} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}'} | {model} | {first} | "
                     f"{_counts(o)} / {_counts(f)}{flag} | {_detected(o)} / {_detected(f)} |")
    lines += ["", "Detections per frame: what the threshold let through on frames 1.. (each side associates them with "
              "the tracked objects; the cap keeps them from adding any). The seeded models' detection scores rise and "
              "fall together from frame to frame, so later frames can pass many more than N (at mid, all 200 queries).",
              ""]
    slopes = r["slopes"]
    if "ort-fp32" in slopes and "reference" in slopes:
        a, b = slopes["ort-fp32"]["ms_per_object"], slopes["reference"]["ms_per_object"]
        lines += [f"**ms per extra object** (least-squares slope of the medians over {', '.join(objects)} objects): "
                  f"ours {a:.1f} ms, reference {b:.1f} ms (ours/reference {a / b:.2f}). "
                  f"Model only: ours {slopes['ort-fp32']['model_ms_per_object']:.1f} ms, reference "
                  f"{slopes['reference']['model_ms_per_object']:.1f} ms.", ""]
    warnings = [f"- {note['asked']} objects: {note['warning']}" for note in r["count_notes"].values()
                if note.get("warning")]
    lines += warnings + ([""] if warnings else [])
    lines += ["![ms per frame](ms_per_frame.png)", "", "![breakdown](breakdown.png)", ""]
    return lines


def _where_time_goes(r: dict, objects: list[str]) -> list[str]:
    """Per-part tables of ours (ort-fp32) and the reference, and ours' host <-> device traffic."""
    ours, ref = r["summary"].get("ort-fp32", {}), r["summary"].get("reference", {})
    lines = ["## Where the time goes, ours (ort-fp32): ms per frame", ""]
    lines += _parts_table(ours, objects)
    lines += ["## Where the time goes, reference: ms per frame", ""]
    lines += ["The tracker row is every `tracker_model` call (propagation of all objects, and new objects); "
              "\"rest\" is the reference's Python: association, heuristics, bookkeeping.", ""]
    lines += _parts_table(ref, objects)
    lines += ["## Host <-> device traffic per frame, ours (ort-fp32)", "",
              "| objects | to device: copies, bytes | to host: copies, bytes |", "|---|---|---|"]
    for n in objects:
        t = ours.get(n, {}).get("transfers")
        if t:
            lines.append(f"| {n} | {t['host_to_device']:.0f}, {_bytes(t['host_to_device_bytes'])} | "
                         f"{t['device_to_host']:.0f}, {_bytes(t['device_to_host_bytes'])} |")
    lines.append("")
    return lines


def _variants(r: dict, objects: list[str]) -> list[str]:
    """Every variant's times and ratios to the reference, the warm-up runs, the variants' part tables."""
    summary, slopes = r["summary"], r["slopes"]
    lines = ["## Variants of ours", ""]
    lines += ["| variant | status | " + " | ".join(f"{n} obj ms/frame (ratio to ref)" for n in objects)
              + " | ms per extra object (ratio to ref) |", "|---|---|" + "---|" * (len(objects) + 1)]
    ref_slope = slopes.get("reference", {}).get("ms_per_object")
    for name, v in r["variants"].items():
        cells = []
        for n in objects:
            e = summary.get(name, {}).get(n)
            ratio = r["ratios"].get(name, {}).get(n)
            flag = "" if not e or e["counts_ok"] else f", tracked {_counts(e)}"
            cells.append("-" if not e else f"{_span(e['ms'])} ({ratio:.2f}{flag})")
        mine = slopes.get(name, {}).get("ms_per_object")
        per = "-" if mine is None or not ref_slope or mine != mine else f"{mine:.1f} ({mine / ref_slope:.2f})"
        status = "measured" if v["available"] else f"unavailable: {v['reason']}"
        if v.get("chose"):  # the auto variant: the path it took
            status += " as " + " ".join(f"{k}={x}" for k, x in v["chose"].items() if k != "reason")
        lines.append(f"| {name} | {status} | " + " | ".join(cells) + f" | {per} |")
    lines.append("")
    lines += _warmup(r, objects)
    for name in r["variants"]:
        if name != "ort-fp32" and summary.get(name):
            lines += [f"### Where the time goes, {name}: ms per frame", ""]
            lines += _parts_table(summary[name], objects)
    return lines


def _best_against_best(r: dict, objects: list[str]) -> list[str]:
    """Every side of ours against the reference under autocast bf16 (--reference-bf16), if it ran."""
    asked = r.get("reference_bf16")
    if not asked:
        return []
    lines = ["## Against the reference in bf16 (best against best)", ""]
    if not asked["available"]:
        return lines + [f"Not measured: {asked['reason']}.", ""]
    ref16, ref = r["summary"].get("reference-bf16", {}), r["summary"].get("reference", {})
    lines += ["The reference also ran under `torch.autocast(\"cpu\", dtype=torch.bfloat16)`, interleaved with the "
              "other sides, with its own thresholds from its own first-frame scores (as our bf16 and int8 variants). "
              "Ratios: ms per frame of each side over the bf16 reference's.", "",
              "| side | " + " | ".join(f"{n} obj ms/frame (ratio to ref bf16)" for n in objects) + " |",
              "|---|" + "---|" * len(objects)]
    cells = [f"{_span(ref16[n]['ms'])} ({ref16[n]['ms']['median'] / ref[n]['ms']['median']:.2f} of fp32)"
             if n in ref16 and n in ref else "-" for n in objects]
    lines.append("| reference-bf16 | " + " | ".join(cells) + " |")
    for side, ratios in r.get("bf16_ratios", {}).items():
        per_n = r["summary"].get(side, {})
        cells = [f"{_span(per_n[n]['ms'])} ({ratios[n]:.2f})" if n in ratios else "-" for n in objects]
        lines.append(f"| {side} | " + " | ".join(cells) + " |")
    off = [f"{n} ({_counts(ref16[n])})" for n in objects if n in ref16 and not ref16[n]["counts_ok"]]
    return lines + ([""] + [f"The bf16 reference tracked other counts than asked at: {', '.join(off)}."] if off else []) + [""]


def _warmup(r: dict, objects: list[str]) -> list[str]:
    warm = r.get("warmup") or {}
    if not warm:
        return []
    lines = [f"**Warm-up runs** (one per side and count, before the timed ones, over "
             f"{r['settings']['warmup_frames']} frames; a variant that compiles per call shape, openvino *-static, "
             "compiles there): ms per frame, frame by frame.", "",
             "| side | " + " | ".join(f"{n} obj" for n in objects) + " |", "|---|" + "---|" * len(objects)]
    for name, per_n in warm.items():
        lines.append(f"| {name} | " + " | ".join(" / ".join(_fmt(x) for x in per_n.get(n, [])) or "-"
                                                for n in objects) + " |")
    lines.append("")
    return lines


def _fidelity(r: dict) -> list[str]:
    if not r["fidelity"]:
        return ["No fidelity table: no variant other than ort-fp32 was available.", ""]
    lines = ["### Fidelity against ort-fp32", "", r["fidelity_method"], "",
             "| variant | clip | frames | same ids (fraction of frames) | mask IoU mean | mask IoU min | objects/frame (fp32) |",
             "|---|---|---|---|---|---|---|"]
    for name, per_clip in r["fidelity"].items():
        if isinstance(per_clip, str):
            lines.append(f"| {name} | - | - | {per_clip} | | | |")
            continue
        for clip, f in per_clip.items():
            iou = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
            objs = f["objects_per_frame_fp32"]
            lines.append(f"| {name} | {clip} | {f['frames']} | {f['same_ids_fraction']:.3f} | {iou(f['iou_mean'])} | "
                         f"{iou(f['iou_min'])} | {min(objs)}-{max(objs)} |")
    lines.append("")
    return lines


def _rss(r: dict) -> list[str]:
    rss = r.get("rss")
    lines = ["## RSS over a long live stream", ""]
    if not rss:
        return lines + ["Not run (`--rss-frames 0`).", ""]
    lines += [rss["method"], ""]
    lines += ["| side | frames | after load MB | after frame 1 MB | peak MB | end MB | growth MB per 100 frames "
              "(fit after frame 100) | ms/frame first / last block | objects tracked |",
              "|---|---|---|---|---|---|---|---|---|"]
    for side in ("ours", "reference"):
        e = rss.get(side)
        if not e:
            continue
        if "error" in e:
            lines.append(f"| {side} | error: {e['error']} | | | | | | | |")
            continue
        lines.append(f"| {side} | {e['frames']} | {e['start_mb']:.0f} | {e['after_first_mb']:.0f} | {e['peak_mb']:.0f} | "
                     f"{e['end_mb']:.0f} | {e['growth_mb_per_100']:+.1f} | {e['ms_first_block']:.0f} / "
                     f"{e['ms_last_block']:.0f} | {e['tracked']} |")
    lines.append("")
    return lines


def _parts_table(side: dict, objects: list[str]) -> list[str]:
    cats = []
    for n in objects:
        for c in (side.get(n) or {}).get("parts_ms", {}):
            if c not in cats:
                cats.append(c)
    order = list(KINDS)
    cats.sort(key=lambda c: order.index(c) if c in order else len(order))
    out = ["| | " + " | ".join(f"{n} obj" for n in objects) + " |", "|---|" + "---|" * len(objects)]
    for c in cats:
        label = c.removeprefix("graph:") if c.startswith("graph:") else KINDS.get(c, (c,))[0]
        if c == "python":
            label = "Python outside graphs" if any(k.startswith("graph:") for k in cats) else "rest (Python)"
        out.append(f"| {label} | " + " | ".join(_fmt((side.get(n) or {}).get("parts_ms", {}).get(c)) for n in objects)
                   + " |")
    out.append("| **total** | " + " | ".join(_fmt((side.get(n) or {}).get("ms", {}).get("median")) for n in objects)
               + " |")
    return out + [""]


STYLES = {  # side -> (label, colour, marker) in the time plot
    "reference": ("transformers reference", "#333333", "s"),
    "reference-bf16": ("transformers reference, autocast bf16", "#999999", "s"),
    "auto": ("sam3track at the defaults (auto)", "#000000", "*"),
    "ort-fp32": ("sam3track ort-fp32", "#c44e52", "o"),
    "openvino-fp32": ("sam3track openvino-fp32", "#4c72b0", "^"),
    "openvino-bf16": ("sam3track openvino-bf16", "#55a868", "v"),
    "openvino-bf16-rows": ("sam3track openvino-bf16-rows", "#937860", "P"),
    "ort-int8": ("sam3track ort-int8", "#dd8452", "D"),
    "openvino-fp32-static": ("sam3track openvino-fp32-static", "#8172b3", "<"),
    "openvino-bf16-static": ("sam3track openvino-bf16-static", "#2ca02c", ">"),
}


def plots(r: dict, out: Path) -> None:
    """ms_per_frame.png (every side against objects) and breakdown.png (where a frame's time goes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _time_plot(plt, r, out / "ms_per_frame.png")
    _breakdown_plot(plt, r, out / "breakdown.png")


def _time_plot(plt, r: dict, path: Path) -> None:
    objects = [str(n) for n in r["settings"]["objects"]]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for side, (label, colour, marker) in STYLES.items():
        entry = r["summary"].get(side)
        if not entry:
            continue
        ns = [n for n in objects if n in entry]
        med = [entry[n]["ms"]["median"] for n in ns]
        lo = [m - entry[n]["ms"]["min"] for m, n in zip(med, ns)]
        hi = [entry[n]["ms"]["max"] - m for m, n in zip(med, ns)]
        ax.errorbar([int(n) for n in ns], med, yerr=[lo, hi], label=label, color=colour, marker=marker, capsize=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([int(n) for n in objects], objects)
    ax.set_xlabel("objects tracked per frame")
    ax.set_ylabel("ms per frame (median, min-max bars)")
    threads = r["settings"].get("threads_n")
    isa = r["machine"].get("isa", [])
    extensions = " with AMX" if "amx_bf16" in isa else (" with AVX512-BF16" if "avx512_bf16" in isa else "")
    ax.set_title(f"{r['preset']} preset: {r['machine']['cores']}-core {r['machine']['cpu_short']}{extensions}"
                 + (f", {threads} thread{'s' if threads > 1 else ''}" if threads else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _breakdown_plot(plt, r: dict, path: Path) -> None:
    objects = [str(n) for n in r["settings"]["objects"]]
    fig, axes = plt.subplots(1, len(objects), figsize=(3.0 * len(objects) + 1.5, 4.4), squeeze=False)
    seen = {}
    others = [v for v in r["summary"] if v not in ("ort-fp32", "reference", "reference-bf16")]
    fastest = min(others, key=lambda v: sum(e["ms"]["median"] for e in r["summary"][v].values()), default=None)
    sides = ["ort-fp32", "reference"] + ([fastest] if fastest else [])
    for ax, n in zip(axes[0], objects):
        for x, side in enumerate(sides):
            parts = (r["summary"].get(side, {}).get(n) or {}).get("parts_ms", {})
            bottom = 0.0
            for cat in sorted(parts, key=lambda c: list(KINDS).index(c) if c in KINDS else len(KINDS)):
                label, colour = KINDS.get(cat, (cat, "#999999"))
                value = max(parts[cat], 0.0)
                bar = ax.bar(x, value, bottom=bottom, color=colour, width=0.6)
                seen.setdefault(label, bar)
                bottom += value
        ax.set_xticks(list(range(len(sides))), ["ours", "reference"] + ([fastest.replace("openvino", "ov")] if fastest else []),
                      fontsize=8)
        ax.set_title(f"{n} object{'s' if n != '1' else ''}")
        ax.set_ylabel("ms per frame" if n == objects[0] else "")
    fig.suptitle(f"{r['preset']} preset: where a frame's time goes (ours = ort-fp32"
                 + (f"; the fastest variant, {fastest}, beside it)" if fastest else ")"))
    fig.tight_layout(rect=(0, 0, 0.78, 0.95))
    fig.legend(seen.values(), seen.keys(), loc="center left", bbox_to_anchor=(0.79, 0.5), fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    """python -m benchmarks.report OUT_DIR: write results.md and the plots again from OUT_DIR/results.json."""
    import json
    import sys

    out = Path(sys.argv[1])
    results = json.loads((out / "results.json").read_text())
    (out / "results.md").write_text(markdown(results))
    plots(results, out)
    print(f"wrote {out / 'results.md'}")


if __name__ == "__main__":
    main()
