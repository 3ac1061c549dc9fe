"""Inputs and outputs of Meta's SAM 3.1 modules, for checking re-implementations graph by graph.

    <env>/venv/bin/python reference/sam31/dump_modules.py --checkpoint DIR/sam3.1_multiplex.pt --out OUT

The predictor is built and loaded exactly as in run_scenarios.py (Meta's builder and loader); then each
module an exporter turns into a graph is called directly on seeded inputs, at several batch sizes
(frames for the detector side, objects or buckets for the tracker side). Writes, per case,
``OUT/<case>.npz`` (``in/<name>`` and ``out/<name>`` arrays; nested values flattened with dots, a
NestedTensor as ``.tensors`` / ``.mask``) and ``OUT/index.json``: per case the module path (attribute
path from ``predictor.model``), how it was called, every argument and output with dtype and shape (or
its value when not an array), and for composite calls (the grounding head) the inputs and outputs of
each submodule as it was called inside (``sub/<module>/in|out/...``).

Inputs are seeded (torch.Generator(seed)); images are drawn in the normalised range and rounded to
float16 as Meta stores frames. Every case runs under torch.inference_mode, as the predictor does.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import shim  # noqa: E402  (puts Meta's source on sys.path)

import common  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402


# ------------------------------------------------------------------------------------------ flattening
def flatten(prefix: str, x, arrays: dict, values: dict, seen: dict) -> None:
    """Arrays into ``arrays`` (deduplicated: a tensor already stored is referenced), the rest into
    ``values`` (JSON)."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), str(t.dtype)) if t.numel() else None
        if key is not None and key in seen:
            values[prefix] = {"same_as": seen[key]}
            return
        if key is not None:
            seen[key] = prefix
        a = t.cpu()
        if a.is_complex():
            a = torch.view_as_real(a)
            values[prefix + ".__complex__"] = True
        arrays[prefix] = a.contiguous().numpy().copy()
        return
    if isinstance(x, np.ndarray):
        arrays[prefix] = x.copy()
        return
    if type(x).__name__ == "NestedTensor":
        flatten(prefix + ".tensors", x.tensors, arrays, values, seen)
        flatten(prefix + ".mask", x.mask, arrays, values, seen)
        return
    if hasattr(x, "__dataclass_fields__"):
        values[prefix + ".__class__"] = type(x).__name__
        for k in x.__dataclass_fields__:
            flatten(f"{prefix}.{k}", getattr(x, k), arrays, values, seen)
        return
    if isinstance(x, dict):
        for k, v in x.items():
            flatten(f"{prefix}.{k}", v, arrays, values, seen)
        return
    if isinstance(x, (list, tuple)):
        values[prefix + ".__len__"] = len(x)
        for i, v in enumerate(x):
            flatten(f"{prefix}.{i}", v, arrays, values, seen)
        return
    if type(x).__name__ == "Prompt":
        values[prefix + ".__class__"] = "Prompt"
        for k, v in vars(x).items():
            flatten(f"{prefix}.{k}", v, arrays, values, seen)
        return
    values[prefix] = common.jsonable(x)


class Dumper:
    def __init__(self, out: Path):
        self.out = out
        self.index: dict[str, dict] = {}

    def case(self, name: str, module_path: str, call: str, inputs: dict, fn, sub: dict | None = None,
             note: str = ""):
        """Run ``fn(**inputs)`` and save inputs, outputs and (``sub``: name -> module) the calls of
        those submodules made inside."""
        records: list = []
        handles = []
        for sname, mod in (sub or {}).items():
            def hook(m, args, kwargs, out, _n=sname):
                records.append((_n, args, kwargs, out))
            handles.append(mod.register_forward_hook(hook, with_kwargs=True))
        t = time.perf_counter()
        try:
            with torch.inference_mode():
                outputs = fn(**inputs)
        finally:
            for h in handles:
                h.remove()
        dt = time.perf_counter() - t
        arrays: dict = {}
        values: dict = {}
        seen: dict = {}
        for k, v in inputs.items():
            flatten(f"in/{k}", v, arrays, values, seen)
        flatten("out", outputs, arrays, values, seen)
        counts: dict[str, int] = {}
        for sname, args, kwargs, out in records:
            c = counts.get(sname, 0)
            counts[sname] = c + 1
            p = f"sub/{sname}" + (f"#{c}" if c else "")
            flatten(f"{p}/in/args", list(args), arrays, values, seen)
            flatten(f"{p}/in/kwargs", kwargs, arrays, values, seen)
            flatten(f"{p}/out", out, arrays, values, seen)
        tmp = self.out / f"{name}.npz.partial"
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)
        tmp.rename(self.out / f"{name}.npz")
        h = hashlib.sha256()
        for k in sorted(arrays):
            common.update_digest(h, k, arrays[k])
        self.index[name] = {
            "module": module_path,
            "call": call,
            "note": note,
            "arrays": {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in arrays.items()},
            "values": values,
            "submodule_calls": counts,
            "digest": h.hexdigest(),
            "seconds": round(dt, 3),
        }
        print(f"  {name}: {len(arrays)} arrays, {dt:.2f} s", flush=True)


# ------------------------------------------------------------------------------------------ cases
def run(pred, out: Path, seed: int) -> Dumper:
    m = pred.model
    det = m.detector
    trk = m.tracker.model
    vb = det.backbone.vision_backbone
    S = m.image_size
    F = S // 14
    D = Dumper(out)
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    def image(T):
        # normalised pixels in [-1, 1], stored fp16 by Meta's loader and cast back to fp32 at use
        return (torch.rand(T, 3, S, S, generator=g) * 2 - 1).half().float()

    # --- ViT trunk and the three necks (each level); the sine position encoding of each level
    trunk_out = {}
    for T in (1, 2):
        img = image(T)
        D.case(f"vit_trunk_T{T}", "detector.backbone.vision_backbone.trunk", "trunk(images) -> [features]",
               {"images": img}, lambda images: vb.trunk(images))
        with torch.inference_mode():
            trunk_out[T] = (img, vb.trunk(img)[-1])
    # necks: every head and level at T=1; the detector head also at T=2 (level 0 alone is 16 MB a frame)
    for T, heads in ((1, ("convs", "interactive_convs", "propagation_convs")), (2, ("convs",))):
        x = trunk_out[T][1]
        for head in heads:
            for lvl in range(3):
                conv = getattr(vb, head)[lvl]
                D.case(f"neck_{head}_{lvl}_T{T}", f"detector.backbone.vision_backbone.{head}.{lvl}",
                       "conv(trunk_features) (nn.Sequential)", {"trunk_features": x},
                       lambda trunk_features, _c=conv: _c(trunk_features))
    for lvl, size in enumerate((4 * F, 2 * F, F)):
        D.case(f"position_encoding_level{lvl}", "detector.backbone.vision_backbone.position_encoding",
               "position_encoding(features) (depends on the shape only)",
               {"features": torch.zeros(1, 256, size, size)}, lambda features: vb.position_encoding(features))

    # --- text encoder
    lang = det.backbone.language_backbone
    for texts in (["bike"], ["a red car", "visual"], ["person", "visual", "geometric"]):
        B = len(texts)
        D.case(f"text_encoder_B{B}", "detector.backbone.language_backbone",
               "language_backbone(texts, None, device='cpu') -> (pad mask, memory, input embeds); "
               "in/tokens = tokenizer(texts, context_length=32)",
               {"texts": texts, "tokens": lang.tokenizer(texts, context_length=lang.context_length)},
               lambda texts, tokens: lang(texts, None, device=torch.device("cpu")),
               note="tokens is recorded for reference; the call tokenizes texts itself")

    # --- grounding head: geometry encoder CLS path + DETR encoder/decoder + dot-product scoring + seg head
    for T in (1, 2):
        img = trunk_out[T][0]
        text = ["bike", "visual", "geometric"]

        def grounding(images, text_ids, img_ids, _text=text, _T=T):
            with torch.inference_mode():
                bo = {"img_batch_all_stages": images}
                bo.update(det.backbone.forward_image(images, need_interactive_out=False,
                                                     need_propagation_out=False))
                bo.update(det.backbone.forward_text(_text, device=torch.device("cpu")))
                find_input = _FindInput(img_ids=img_ids, text_ids=text_ids)
                out = det.forward_grounding(backbone_out=bo, find_input=find_input, find_target=None,
                                            geometric_prompt=det._get_dummy_prompt(num_prompts=_T))
            keep = ("pred_logits", "pred_boxes", "pred_boxes_xyxy", "pred_masks", "semantic_seg",
                    "presence_logit_dec", "queries", "encoder_hidden_states")
            return {k: out[k] for k in keep if k in out}

        D.case(f"grounding_T{T}", "detector (forward_grounding)",
               "detector.forward_grounding(backbone_out=forward_image(images)+forward_text(texts), "
               "find_input(img_ids, text_ids), geometric_prompt=_get_dummy_prompt(T)) on the text "
               "'bike' (row 0 of ['bike','visual','geometric'])",
               {"images": img, "text_ids": torch.zeros(T, dtype=torch.long),
                "img_ids": torch.arange(T, dtype=torch.long)},
               grounding,
               sub={"geometry_encoder": det.geometry_encoder, "transformer.encoder": det.transformer.encoder,
                    "transformer.decoder": det.transformer.decoder, "dot_prod_scoring": det.dot_prod_scoring,
                    "segmentation_head": det.segmentation_head},
               note="pred_logits are the joint logits inverse_sigmoid(sigmoid(cls)*sigmoid(presence)) "
                    "clamped to +-10; the geometry encoder runs for text-only prompts (CLS token)")

    # --- interactive SAM head (clicks; and births: mask prompt from interactive_mask_downsample)
    pe = trk.interactive_sam_prompt_encoder
    dec = trk.interactive_sam_mask_decoder
    prompt_cases = {
        "n1_points1": (torch.rand(1, 1, 2, generator=g) * S, torch.tensor([[1]], dtype=torch.int32), None),
        "n2_points3": (torch.rand(2, 3, 2, generator=g) * S,
                       torch.tensor([[1, 0, 1], [1, 1, -1]], dtype=torch.int32), None),
        "n3_mask": (torch.zeros(3, 1, 2), -torch.ones(3, 1, dtype=torch.int32), randn(3, 1, 4 * F, 4 * F, scale=3)),
    }
    sparse_dense = {}
    for cname, (pts, lab, mask) in prompt_cases.items():
        D.case(f"interactive_prompt_encoder_{cname}", "tracker.model.interactive_sam_prompt_encoder",
               "prompt_encoder(points=(coords [n,P,2] pixels in the 14F image, labels int32 [n,P]), "
               "boxes=None, masks=[n,1,4F,4F] or None)",
               {"point_coords": pts, "point_labels": lab, "masks": mask},
               lambda point_coords, point_labels, masks: pe(points=(point_coords, point_labels), boxes=None,
                                                            masks=masks))
        with torch.inference_mode():
            sparse_dense[cname] = pe(points=(pts, lab), boxes=None, masks=mask)
    D.case("interactive_prompt_encoder_dense_pe", "tracker.model.interactive_sam_prompt_encoder",
           "get_dense_pe()", {}, lambda: pe.get_dense_pe())
    emb = randn(1, 256, F, F)
    hr = [randn(1, 32, 4 * F, 4 * F), randn(1, 64, 2 * F, 2 * F)]
    for cname, multimask in (("n1_points1", True), ("n2_points3", False), ("n3_mask", False)):
        sp, de = sparse_dense[cname]
        D.case(f"interactive_mask_decoder_{cname}_multimask{int(multimask)}",
               "tracker.model.interactive_sam_mask_decoder",
               "mask_decoder(image_embeddings, image_pe, sparse, dense, multimask_output, repeat_image=True, "
               "high_res_features=[s0, s1]) -> (masks, iou, sam tokens, object score logits)",
               {"image_embeddings": emb, "image_pe": pe.get_dense_pe(), "sparse_prompt_embeddings": sp,
                "dense_prompt_embeddings": de, "multimask_output": multimask, "repeat_image": True,
                "high_res_features": hr},
               lambda **k: dec(**k),
               note="image_embeddings = interactive neck level 2 + interactivity_no_mem_embed in the "
                    "predictor; high_res_features = conv_s0/conv_s1 of interactive neck levels 0/1")
    for n in (1, 3):
        D.case(f"interactive_mask_downsample_n{n}", "tracker.model.interactive_mask_downsample",
               "Conv2d(1,1,k4,s4) on the 16F birth mask -> 4F mask prompt",
               {"mask": (torch.rand(n, 1, 16 * F, 16 * F, generator=g) > 0.5).float()},
               lambda mask: trk.interactive_mask_downsample(mask))

    # --- multiplex mask decoder (propagation), valid / invalid slot embeddings
    mdec = trk.sam_mask_decoder
    K = 16
    for B, n_valid in ((1, [10]), (2, [16, 5]), (3, [16, 16, 1])):
        valid = torch.zeros(B, K, dtype=torch.bool)
        for b, nv in enumerate(n_valid):
            valid[b, :nv] = True
        if B == 3:
            valid[0, 3] = False  # a removed slot (hole) inside a full bucket
        vm = valid.unsqueeze(-1).float()
        extra = vm * trk.output_valid_embed.unsqueeze(0) + (1 - vm) * trk.output_invalid_embed.unsqueeze(0)
        D.case(f"multiplex_mask_decoder_B{B}", "tracker.model.sam_mask_decoder",
               "MultiplexMaskDecoder(image_embeddings [B,256,F,F], image_pe, multimask_output=True, "
               "high_res_features=[s0 [B,32,4F,4F], s1 [B,64,2F,2F]], extra_per_object_embeddings "
               "= valid*output_valid_embed + (1-valid)*output_invalid_embed [B,16,256])",
               {"image_embeddings": randn(B, 256, F, F), "image_pe": trk.get_propagation_dense_pe(),
                "multimask_output": True,
                "high_res_features": [randn(B, 32, 4 * F, 4 * F), randn(B, 64, 2 * F, 2 * F)],
                "extra_per_object_embeddings": extra, "valid_object_mask": valid},
               lambda valid_object_mask, **k: mdec(**k),
               note="valid_object_mask is recorded for reference (the call gets the merged embeddings); "
                    "image_pe = tracker.model.get_propagation_dense_pe() (image_pe_layer)")

    # --- decoupled memory attention
    enc = trk.transformer.encoder
    for B, n_mem, P in ((1, 1, 1), (2, 2, 3), (3, 3, 2)):
        HW = F * F
        D.case(f"memory_attention_B{B}_mem{n_mem}_ptr{P}", "tracker.model.transformer.encoder",
               "encoder(image [HW,1,C], src [HW,B,C], memory_image [n*HW,1,C], memory [n*HW+16P,B,C], "
               "image_pos, src_pos, memory_image_pos [n*HW,1,C], memory_pos [n*HW+16P,B,C], "
               "num_obj_ptr_tokens=16P) -> {memory [HW,B,C], pos_embed}",
               {"image": randn(HW, 1, 256), "src": randn(HW, B, 256), "memory_image": randn(n_mem * HW, 1, 256),
                "memory": randn(n_mem * HW + 16 * P, B, 256), "image_pos": randn(HW, 1, 256, scale=0.5),
                "src_pos": randn(HW, B, 256, scale=0.5), "memory_image_pos": randn(n_mem * HW, 1, 256, scale=0.5),
                "memory_pos": randn(n_mem * HW + 16 * P, B, 256, scale=0.5), "num_obj_ptr_tokens": 16 * P},
               lambda **k: enc(**k))

    # --- multiplex memory encoder, both mask sizes (14F conditioning / prompt masks, 16F propagated)
    mem = trk.maskmem_backbone
    # (the 16F size is the propagation path, run every frame: three bucket counts; 14F: births/clicks)
    for H, batches in ((14 * F, (1, 2)), (16 * F, (1, 2, 3))):
        for B in batches:
            masks = torch.tanh(randn(B, K, H, H, scale=3))          # sigmoid*2-1 range
            masks[-1, K // 2:] = 0.0                                  # empty slots give 0
            cond = torch.zeros(B, K, H, H)
            cond[0, :2] = 1.0                                         # two conditioning objects
            D.case(f"memory_encoder_H{H}_B{B}", "tracker.model.maskmem_backbone",
                   "maskmem_backbone(pix_feat [1,256,F,F], masks [B,32,H,H] = (16 mask channels in [-1,1] "
                   "| 16 conditioning channels), skip_mask_sigmoid=True) -> {vision_features, vision_pos_enc}",
                   {"pix_feat": randn(1, 256, F, F), "masks": torch.cat([masks, cond], 1),
                    "skip_mask_sigmoid": True},
                   lambda pix_feat, masks, skip_mask_sigmoid: mem(pix_feat, masks,
                                                                  skip_mask_sigmoid=skip_mask_sigmoid),
                   note="the predictor then adds sum over absent/empty slots of no_obj_embed_spatial[slot] "
                        "(video_tracking_multiplex.py:1743-1773), outside this module")

    # --- object-pointer projections
    for name in ("obj_ptr_proj", "interactive_obj_ptr_proj", "no_obj_ptr_linear", "obj_ptr_tpos_proj"):
        mod = getattr(trk, name)
        for N in (1, 16, 32):
            D.case(f"{name}_N{N}", f"tracker.model.{name}", f"{name}(x [N,256])", {"x": randn(N, 256)},
                   lambda x, _m=mod: _m(x))
    D.case("propagation_dense_pe", "tracker.model (get_propagation_dense_pe)",
           "get_propagation_dense_pe() = image_pe_layer((F,F)).unsqueeze(0)", {},
           lambda: trk.get_propagation_dense_pe())
    return D


class _FindInput:
    """The two FindStage fields forward_grounding reads for a text prompt (img_ids, text_ids)."""

    def __init__(self, img_ids, text_ids):
        self.img_ids = img_ids
        self.text_ids = text_ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--config", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vit-mlp", choices=("fp32", "bf16"), default=shim.DEFAULT_NUMERICS["vit_mlp"])
    a = ap.parse_args(argv)
    if not a.checkpoint.is_file():
        ap.error(f"checkpoint not found: {a.checkpoint}")
    common.setup_threads(a.threads)
    numerics = shim.install({"vit_mlp": a.vit_mlp})
    cfg = common.read_config(a.checkpoint, a.config)
    config = {k: cfg[k] for k in shim.CONFIG_KEYS}
    t0 = time.time()
    pred = shim.build_predictor(config=config, checkpoint_path=str(a.checkpoint))
    pred.model.eval()
    a.out.mkdir(parents=True, exist_ok=True)
    D = run(pred, a.out, a.seed)
    common.write_json(a.out / "index.json", {
        "checkpoint": str(a.checkpoint), "config": config, "numerics": numerics, "seed": a.seed,
        "facts": common.run_facts(a.threads), "total_s": round(time.time() - t0, 2), "cases": D.index})
    print(f"done: {len(D.index)} cases in {time.time() - t0:.1f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
