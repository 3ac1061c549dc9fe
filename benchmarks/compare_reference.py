"""Speed of sam3track against transformers' Sam3VideoModel on the same machine, frames and weights.

    python benchmarks/compare_reference.py [--bundle DIR] [--frames N] [--prompts bike phone]

Without --bundle it exports the tiny seeded bundle to a temporary directory. Both sides get the same
pixel values and token ids; mask NMS and hole filling are off on both (transformers skips them without
the `kernels` package). Prints frames per second of each and the ratio (higher is better for us).
Each side first runs a 3-frame warm-up session; then the whole run is timed (frames / wall time:
outputs are held back by the hotstart delay, so per-yield times would mislead).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path)
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--prompts", nargs="+", default=["bike", "phone"])
    args = parser.parse_args()

    import torch
    from transformers import Sam3VideoModel
    from transformers.models.sam3_video.modeling_sam3_video import Sam3VideoInferenceSession

    import sam3track
    from sam3track.postprocess import to_pixel_values
    from sam3track.video import open_video

    bundle = args.bundle
    if bundle is None:
        from graphs.export import export_bundle

        bundle = export_bundle(None, Path(tempfile.mkdtemp()) / "tiny", tiny_seed=0, log=lambda *_: None)
    with open_video(REPO / "examples" / "clips" / "bikes.mp4") as video:
        frames = np.stack([video.read(76 + i) for i in range(args.frames)])

    predictor = sam3track.load(bundle, mask_nms=False, fill_holes=False)

    def run_ours(clip):
        session = predictor.start_session(clip)
        for text in args.prompts:
            session.add_prompt(text=text)
        started = time.perf_counter()
        count = sum(1 for _ in session.propagate())
        return count / (time.perf_counter() - started), len(session.object_ids)

    model = Sam3VideoModel.from_pretrained(str(Path(bundle) / "source")).eval()

    def run_reference(clip):
        pixels = torch.from_numpy(np.concatenate([to_pixel_values(f, predictor.config) for f in clip]))
        ref = Sam3VideoInferenceSession(video=pixels, video_height=clip.shape[1], video_width=clip.shape[2],
                                        dtype=torch.float32)
        for text in args.prompts:
            pid = ref.add_prompt(text)
            ids, mask = predictor.tokenizer(text)
            ref.prompt_input_ids[pid] = torch.from_numpy(ids)
            ref.prompt_attention_masks[pid] = torch.from_numpy(mask)
        started = time.perf_counter()
        with torch.inference_mode():
            count = sum(1 for _ in model.propagate_in_video_iterator(ref, start_frame_idx=0,
                                                                     max_frame_num_to_track=len(clip) - 1))
        return count / (time.perf_counter() - started)

    run_ours(frames[:3]), run_reference(frames[:3])  # warm-up
    ours, objects = run_ours(frames)
    reference = run_reference(frames)
    print(f"frames {len(frames)}  objects at the end {objects}  torch threads {torch.get_num_threads()}")
    print(f"sam3track (onnxruntime cpu) {ours:7.2f} frames/s")
    print(f"transformers reference      {reference:7.2f} frames/s")
    print(f"ratio                       {ours / reference:7.2f}x")


if __name__ == "__main__":
    main()
