"""The seeded models the benchmark measures, exported once into a cache directory.

- ``tiny`` and ``mid``: ``graphs.sam3.export.export_bundle(None, out, tiny_seed=0, tiny_preset=preset)``; the
  reference loads the seeded checkpoint the bundle keeps in ``<bundle>/source``.
- ``full``: the default ``Sam3VideoConfig`` at full size (1008 px, 32-layer ViT, 200 queries ...), with
  weights drawn by the same seeded rule as the small presets (``graphs.sam3.tiny._rescale_weights``) and the
  small tokenizer (a real snapshot's CLIP vocabulary is not needed to time a frame). Written here as an
  ordinary checkpoint directory and exported like a real one, so graphs/ needs no preset for it.

A cached bundle is keyed by preset, seed, variant and a hash of the exporter's sources (graphs/**/*.py), so
a change to the graphs (say, a fused attention) exports afresh instead of measuring a stale bundle.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Preset:
    name: str
    prompts: tuple[str, ...]  # the same prompts at every object count: only the count changes
    objects: tuple[int, ...]
    frames: int
    reps: int
    warmup_frames: int  # of the one warm-up run per side and object count


# tiny has 16 detector queries per prompt, so 64 objects need four prompts; these four give 16 distinct
# scores each on the benchmark's first frame ("car" gives 16 equal ones: no threshold could pick N of
# them). mid and full have 200 queries: one prompt reaches 64.
# Warm-up over every frame (tiny, mid): its calls see every shape the timed runs see, so a variant that
# compiles per shape (openvino *-static) compiles there, and that cost is the warm-up's, reported apart.
PRESETS = {
    "tiny": Preset("tiny", ("person", "bike", "dog", "cat"), (1, 4, 16, 64), frames=8, reps=3, warmup_frames=8),
    # mid: seconds per frame, tens of seconds at 64 objects on 2 cores; about 40 minutes with these
    "mid": Preset("mid", ("person",), (1, 4, 16, 64), frames=3, reps=2, warmup_frames=3),
    # full: the births frame and one tracked frame, minutes each
    "full": Preset("full", ("person",), (1, 4, 16), frames=2, reps=1, warmup_frames=1),
}


@dataclass(frozen=True)
class BundleInfo:
    preset: str
    variant: str  # "fp32" or "int8-<graphs>"
    bundle: Path
    source: Path  # the checkpoint directory the reference loads
    export_seconds: float | None  # None: found in the cache


def exporter_hash() -> str:
    """A short hash of the exporter's sources: bundles exported by other code are not reused."""
    h = hashlib.sha256()
    for path in sorted((REPO / "graphs").rglob("*.py")):  # the families' exporters are in subfolders
        h.update(str(path.relative_to(REPO / "graphs")).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:10]


def int8_supported() -> str | None:
    """None when graphs.export can quantise graphs to int8, else why not."""
    from graphs.sam3.export import export_bundle

    if "int8" not in inspect.signature(export_bundle).parameters:
        return "graphs.sam3.export.export_bundle has no int8= option in this checkout (being added by the lead)"
    return None


def get_bundle(preset: str, cache: Path, seed: int = 0, int8: tuple[str, ...] = (), log=print) -> BundleInfo:
    """The bundle of `preset` (fp32, or with `int8` graphs quantised), exported into `cache` unless it is
    there already."""
    variant = "fp32" if not int8 else "int8-" + "+".join(int8)
    cache = Path(cache).absolute()
    out = cache / f"{preset}-seed{seed}-{variant}-{exporter_hash()}"
    if preset == "full":
        source = cache / f"full-seed{seed}-checkpoint"
        if not (source / "config.json").is_file():
            log(f"writing the seeded full-size checkpoint to {source} (minutes) ...")
            write_full_checkpoint(source, seed)
    else:
        source = out / "source"
    if (out / "manifest.json").is_file():
        return BundleInfo(preset, variant, out, source, None)
    from graphs.sam3.export import export_bundle

    log(f"exporting the {preset} bundle ({variant}) to {out} ...")
    started = time.perf_counter()
    kwargs = {"int8": tuple(int8)} if int8 else {}
    if preset == "full":
        export_bundle(source, out, log=lambda *_: None, **kwargs)
    else:
        export_bundle(None, out, tiny_seed=seed, tiny_preset=preset, log=lambda *_: None, **kwargs)
    seconds = time.perf_counter() - started
    log(f"exported in {seconds:.0f} s")
    return BundleInfo(preset, variant, out, source, round(seconds, 1))


def full_config():
    """The default (real) Sam3VideoConfig, full size, with the small presets' detection thresholds
    (random weights score lower than trained ones; the benchmark sets its own on both sides anyway)."""
    from transformers import Sam3VideoConfig

    cfg = Sam3VideoConfig()
    cfg.score_threshold_detection = 0.2
    cfg.new_det_thresh = 0.5
    return cfg


def write_full_checkpoint(out_dir: Path, seed: int = 0) -> Path:
    """The full-size default-config model with seeded weights, saved as a Hugging Face checkpoint
    directory (what graphs.sam3.tiny.write_tiny_checkpoint does for the small presets)."""
    import torch
    from transformers import Sam3VideoModel

    from graphs.sam3.tiny import TinyPreset, _rescale_weights, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    cfg = full_config()
    text = cfg.detector_config.text_config
    text.vocab_size = len(tokenizer)
    text.eos_token_id, text.bos_token_id, text.pad_token_id = (tokenizer.eos_token_id, tokenizer.bos_token_id,
                                                                tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = Sam3VideoModel(cfg).eval()
    # only tracker_object_logit of the preset is read (None: keep the random draw, as tiny and mid)
    _rescale_weights(model, seed, TinyPreset("full", 0, 0, 0, 0, 0, 0, 0, 0))
    out_dir = Path(out_dir)
    staging = out_dir.with_name(out_dir.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    size = cfg.image_size
    (staging / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Sam3ImageProcessorFast", "do_resize": True,
        "size": {"height": size, "width": size}, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 2,
    }, indent=2))
    staging.rename(out_dir)
    return out_dir
