"""One side of the long-stream RSS measurement, in a process of its own (run by benchmarks.run).

    python -m benchmarks.stream SPEC.json OUT.json

A live stream, frame after frame: ours through `session.track(frame)`, the reference through its
streaming call `model(inference_session=session, frame=pixel_values)`, each result postprocessed to
masks at video resolution as a user would. Frames: the continuous shot of bikes.mp4 played forward
then backward, again and again (no scene cut, so the tracked objects stay in view). RSS (VmRSS from
/proc) is sampled after loading, after the first frame and every `every` frames; VmHWM (the kernel's
peak RSS) at the end. Each side runs alone in its process, so one's allocations never count for the other.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def proc_status(field: str) -> float:
    """A memory field of /proc/self/status in MB (nan where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def stream_frames(clip: Path, start: int, length: int) -> np.ndarray:
    """The shot [start, start + length) forward then backward: a loop without a cut."""
    from sam3track.video import open_video

    with open_video(clip) as video:
        shot = np.stack([video.read(start + i) for i in range(length)])
    return np.concatenate([shot, shot[-2:0:-1]])


def run(spec: dict) -> dict:
    import sam3track

    loop = stream_frames(Path(spec["clip"]), spec["start_frame"], spec["shot_frames"])
    h, w = loop.shape[1:3]
    n, every, side = spec["frames"], spec["every"], spec["side"]
    if side == "reference":  # the bundle's preprocessing and tokenizer only: no graph loaded in this process
        from sam3track.bundle import Bundle
        from sam3track.families.sam3.config import TrackerConfig
        from sam3track.tokenizer import PromptTokenizer

        from .measure import Reference

        bundle = Bundle.open(Path(spec["bundle"]))
        config = TrackerConfig.from_manifest(bundle.manifest)
        tokenizer = PromptTokenizer(bundle.tokenizer_file, config.text_length, config.pad_token_id)
        ref = Reference(spec["source"], threads=spec.get("threads"))
        ref.configure(spec["overrides"])
        pixels = ref.pixels(loop, config)
        session = ref.new_session(None, h, w, spec["prompts"], tokenizer, streaming=True)

        def step(i):
            out = ref.model(inference_session=session, frame=pixels[i % len(loop)])
            return len(session.obj_ids), len(ref.postprocess(session, out)["object_ids"])
    else:
        predictor = sam3track.load(spec["bundle"], threads=spec.get("threads"), **spec["ours_overrides"],
                                   **spec["overrides"])
        session = predictor.start_session(None)
        for text in spec["prompts"]:
            session.add_prompt(text=text)

        def step(i):
            result = session.track(loop[i % len(loop)])
            return len(session.object_ids), len(result.object_ids)

    samples = [{"frames": 0, "rss_mb": round(proc_status("VmRSS"), 1), "tracked": 0, "shown": 0, "ms_median": None}]
    times = []
    started = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        tracked, shown = step(i)
        times.append(1e3 * (time.perf_counter() - t0))
        if i == 0 or (i + 1) % every == 0 or i == n - 1:
            samples.append({"frames": i + 1, "rss_mb": round(proc_status("VmRSS"), 1), "tracked": tracked,
                            "shown": shown, "ms_median": round(statistics.median(times), 2)})
            times = []
            print(json.dumps(samples[-1]), flush=True)
    return {"side": side, "frames": n, "seconds": round(time.perf_counter() - started, 1),
            "peak_rss_mb": round(proc_status("VmHWM"), 1), "samples": samples}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = run(spec)
    Path(sys.argv[2]).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
