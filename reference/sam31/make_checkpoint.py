"""A seeded tiny SAM 3.1 checkpoint in Meta's real format (run with the reference env's python).

    <env>/venv/bin/python reference/sam31/make_checkpoint.py --out DIR [--seed 0] [--confident]

Builds the small model (shim.SMALL) with Meta's own builder ``build_sam3_predictor(version="sam3.1")``,
seeded random weights, and writes to DIR:

  sam3.1_multiplex.pt          one flat state dict, laid out like facebook/sam3.1's file of that name:
                               keys ``detector.*`` and ``tracker.model.*``, tensors only (torch.save of a
                               plain dict; loads with torch.load(weights_only=True) anywhere, no Meta classes)
  small_config.json            the builder sizes (and the derived sizes an exporter needs)
  bpe_simple_vocab_16e6.txt.gz Meta's CLIP BPE vocabulary, which the text encoder's tokenizer reads
  checkpoint_info.json         sha256, key and parameter counts, dtypes, and the verification below

Tensors that Meta's builder initialises as copies of one another (the three necks, repeated layers) are
told apart by a little seeded noise (make_copies_distinct), as training tells them apart.

``--confident`` shifts four biases of the seeded weights (CONFIDENT_SHIFTS) so that the detector and the
tracker are confident, as trained weights are: random weights score detections ~0.14 and tracked objects
~0.54, under the 0.8 that Meta's reconditioning hard-codes for both (sam3_multiplex_base.py
``_recondition_masklets`` and ``_associate_det_trk_compilable``), so without it no scenario reaches that
code. The presence head's output bias +6 (presence ~1), the propagation decoder's object-score head's
output bias +3 (tracker probabilities ~0.96), and the dot-product scoring's two projection biases along
one channel (hs_proj +6, prompt_proj +4: every query's class logit gains 6 * 4 / sqrt(256) = 1.5 plus
terms that still depend on the query), which lifts the top detections to ~0.87. Nothing else changes.

Verification (unless --no-verify): a second predictor is built through Meta's loader
``build_sam3_predictor(checkpoint_path=...)`` from a *different* seed, and
  * the loader reports no missing and no unexpected keys (its own printout is parsed), and the loaded
    model's state dict equals the file key for key, byte for byte;
  * both predictors give byte-identical responses on a 3-frame clip (text prompt, 2 propagated frames).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import shim  # noqa: E402  (puts Meta's source on sys.path)

import common  # noqa: E402

CKPT_NAME = "sam3.1_multiplex.pt"
PREFIXES = ("detector.", "tracker.model.")
# --confident: (key, channel or None for every element, added value); see the module docstring
CONFIDENT_SHIFTS = (
    ("detector.transformer.decoder.presence_token_head.layers.2.bias", None, 6.0),
    ("tracker.model.sam_mask_decoder.pred_obj_score_head.layers.2.bias", None, 3.0),
    ("detector.dot_prod_scoring.hs_proj.bias", 0, 6.0),
    ("detector.dot_prod_scoring.prompt_proj.bias", 0, 4.0),
)


COPY_NOISE = 0.05  # relative spread of the noise that tells apart the copies Meta's builder makes


def make_copies_distinct(model, sd: dict, seed: int) -> list[str]:
    """Tell apart the tensors that Meta's builder initialises as copies of one another, as training does:
    the three necks (convs, propagation_convs, interactive_convs), the memory fuser's two layers, the
    geometry encoder's layers and more are deep copies at init. With copies, a mix-up between them in an
    exporter's key mapping gives the same outputs, and a runtime that merges identical subgraphs
    (OpenVINO computes the detector and propagation necks once: both read the trunk's features) runs
    less than a trained model costs. Every tensor equal to an earlier one (and not constant) is
    multiplied by 1 + COPY_NOISE * N(0, 1), seeded; the first of each group is kept. Returns the keys
    changed; ``sd`` and ``model`` both change."""
    import hashlib

    import torch

    gen = torch.Generator().manual_seed(seed + 7919)
    seen, changed = set(), []
    for key, value in sd.items():
        if not value.is_floating_point() or value.numel() < 2 or bool((value == value.flatten()[0]).all()):
            continue
        digest = (tuple(value.shape), hashlib.sha256(value.numpy().tobytes()).hexdigest())
        if digest in seen:
            noise = torch.randn(value.shape, generator=gen, dtype=torch.float32).to(value.dtype)
            sd[key] = value * (1 + COPY_NOISE * noise)
            changed.append(key)
        else:
            seen.add(digest)
    model.load_state_dict(sd, strict=True)
    return changed


def make_confident(model, sd: dict) -> None:
    """Apply CONFIDENT_SHIFTS to the state dict and load it back into the model (both change)."""
    for key, channel, value in CONFIDENT_SHIFTS:
        if channel is None:
            sd[key] += value
        else:
            sd[key][channel] += value
    model.load_state_dict(sd, strict=True)


def state_dict_of(model) -> dict:
    import torch

    sd = {}
    for k, v in model.state_dict().items():
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"state dict entry {k} is a {type(v).__name__}, not a tensor")
        sd[k] = v.detach().clone().contiguous()
    return sd


def tensor_sha(t) -> str:
    import torch

    t = t.detach().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def verify_outputs(preds: list, frames_dir: Path) -> list[str]:
    """Same request sequence on each predictor; returns each run's response digest."""
    import driver

    digests = []
    for pred in preds:
        m = pred.model
        saved = (m.score_threshold_detection, m.new_det_thresh, m.det_nms_thresh)
        # random weights score ~0.14: a threshold of 0 keeps every query (up to max_num_objects)
        m.score_threshold_detection, m.new_det_thresh, m.det_nms_thresh = 0.0, 0.0, 0.0
        try:
            d = driver.Driver(pred, log=lambda *_: None)
            d.start(frames_dir)
            d.request("text", type="add_prompt", frame_index=0, text="bike")
            d.stream("propagate", propagation_direction="forward", start_frame_index=0)
            d.close()
        finally:
            m.score_threshold_detection, m.new_det_thresh, m.det_nms_thresh = saved
        digests.append(d.results()["digest"])
    return digests


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--confident", action="store_true", help="shift the biases of CONFIDENT_SHIFTS")
    a = ap.parse_args(argv)
    common.setup_threads(a.threads)
    import torch

    numerics = shim.install()
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    pred = shim.build_predictor(config=shim.SMALL, seed=a.seed)
    build_s = time.time() - t0
    sd = state_dict_of(pred.model)
    distinct = make_copies_distinct(pred.model, sd, a.seed)
    if a.confident:
        make_confident(pred.model, sd)
    bad = [k for k in sd if not k.startswith(PREFIXES)]
    if bad:
        raise RuntimeError(f"state dict keys outside {PREFIXES}: {bad[:5]}")
    ckpt = out / CKPT_NAME
    tmp = out / (CKPT_NAME + ".partial")
    torch.save(sd, tmp)
    tmp.rename(ckpt)
    # the file must load without any Meta (or other) class: tensors in a plain dict
    back = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert type(back) is dict and list(back) == list(sd), "reloaded checkpoint differs in keys"

    config = {
        "format": "sam3track SAM 3.1 small-config description",
        "builder": "sam3.model_builder.build_sam3_predictor(version='sam3.1'), sizes via reference/sam31/shim.py",
        "meta_commit": "96914d2425f90a64f45ca977c2b5165418099543",
        "seed": a.seed,
        "confident": bool(a.confident),
        **shim.SMALL,
        "derived": {
            "backbone_stride": 14,
            "feat_size": shim.SMALL["image_size"] // 14,
            "low_res_mask_size": 4 * (shim.SMALL["image_size"] // 14),
            "mem_mask_input_size": 16 * (shim.SMALL["image_size"] // 14),
            "vit_mlp_hidden": int(shim.SMALL["vit_embed_dim"] * 4.625),
            "tri_neck_scale_factors": [4.0, 2.0, 1.0],
            "d_model": 256,
            "text_context_length": 32,
            "text_vocab_size": 49408,
            "det_num_queries": 200,
            "multiplex_count": 16,
            "num_maskmem": 7,
            "max_obj_ptrs_in_encoder": 16,
            "memattn_heads": 8,
            "max_num_objects_default": 16,
        },
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "tokenizer": "bpe_simple_vocab_16e6.txt.gz",
    }
    common.write_json(out / "small_config.json", config)
    shutil.copyfile(shim.bpe_path(), out / "bpe_simple_vocab_16e6.txt.gz")

    prefix_counts: dict[str, int] = {}
    for k in sd:
        p = ".".join(k.split(".")[:2]) if k.startswith("detector.") else ".".join(k.split(".")[:3])
        prefix_counts[p] = prefix_counts.get(p, 0) + 1
    info = {
        "file": CKPT_NAME,
        "sha256": common_sha(ckpt),
        "bytes": ckpt.stat().st_size,
        "num_keys": len(sd),
        "num_parameters": sum(p.numel() for p in pred.model.parameters()),
        "num_elements": sum(v.numel() for v in sd.values()),
        "dtypes": {str(dt).replace("torch.", ""): sum(1 for v in sd.values() if v.dtype == dt)
                   for dt in sorted({v.dtype for v in sd.values()}, key=str)},
        "non_float32_keys": sorted(k for k, v in sd.items() if v.dtype != torch.float32),
        "prefix_counts": prefix_counts,
        "tensor_sha256": {k: tensor_sha(v) for k, v in sd.items()},
        "numerics": numerics,
        "confident_shifts": [list(x) for x in CONFIDENT_SHIFTS] if a.confident else [],
        "copies_made_distinct": distinct,
        "build_s": round(build_s, 2),
        "facts": common.run_facts(a.threads),
    }

    if not a.no_verify:
        t1 = time.time()
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            loaded = shim.build_predictor(config=shim.SMALL, seed=a.seed + 1, checkpoint_path=str(ckpt))
        printed = buf.getvalue()
        sys.stdout.write(printed)
        # build_sam3_multiplex_video_predictor prints "Missing keys (N): ..." / "Unexpected keys (N):"
        # for the real (demo model) load; the tracker-only pre-load it also does prints without "(N)".
        demo_missing = re.findall(r"Missing keys \((\d+)\)", printed)
        demo_unexpected = re.findall(r"Unexpected keys \((\d+)\)", printed)
        lsd = loaded.model.state_dict()
        key_diff = sorted(set(lsd) ^ set(sd))
        value_diff = [k for k in sd if k in lsd and tensor_sha(lsd[k]) != info["tensor_sha256"][k]]
        with tempfile.TemporaryDirectory() as td:
            frames = common.decode_frames(common.CLIPS / "bikes.mp4", 3)
            common.write_png_folder(frames, Path(td) / "clip")
            digests = verify_outputs([pred, loaded], Path(td) / "clip")
        info["verification"] = {
            "loader": "sam3.model_builder.build_sam3_predictor(version='sam3.1', checkpoint_path=...)",
            "loader_reported_missing": [int(n) for n in demo_missing],
            "loader_reported_unexpected": [int(n) for n in demo_unexpected],
            "state_dict_key_differences": key_diff,
            "state_dict_value_differences": value_diff,
            "response_digests": {"built": digests[0], "loaded": digests[1]},
            "identical_outputs": digests[0] == digests[1],
            "seconds": round(time.time() - t1, 1),
        }
        ok = (not demo_missing and not demo_unexpected and not key_diff and not value_diff
              and digests[0] == digests[1])
        info["verification"]["ok"] = ok
        common.write_json(out / "checkpoint_info.json", info)
        if not ok:
            print(json.dumps(info["verification"], indent=1), file=sys.stderr)
            print("error: checkpoint verification failed", file=sys.stderr)
            return 1
    else:
        common.write_json(out / "checkpoint_info.json", info)
    print(f"wrote {ckpt} ({info['num_keys']} keys, {info['num_parameters'] / 1e6:.1f} M parameters, "
          f"{info['bytes'] / 1e6:.0f} MB) in {time.time() - t0:.1f} s")
    return 0


def common_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


if __name__ == "__main__":
    sys.exit(main())
