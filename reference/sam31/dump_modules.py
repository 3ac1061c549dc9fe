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


# The small config's image is one ViT window (16 tokens padded to 24); the full model's 72 is 3x3
# windows. At 448 px the grid is 32, padded to 48: 2x2 windows, so partitioning is dumped there too.
WINDOWS_2X2_IMAGE = 448


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
def run(pred, out: Path, seed: int, config: dict) -> Dumper:
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
    trunk_of_2x2_windows(D, vb.trunk, config, seed)
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

    tracker_steps(D, trk, vb, F, g)
    box_grounding(D, det, trunk_out, g)
    return D


def trunk_of_2x2_windows(D: Dumper, trunk, config: dict, seed: int) -> None:
    """The trunk's weights in Meta's ViT built alone at WINDOWS_2X2_IMAGE px (its RoPE tables made for
    that size), on an image of its own generator so the other cases' seeded inputs stay as they were."""
    wide = shim.vit_trunk(config, WINDOWS_2X2_IMAGE).eval()
    missing, unexpected = wide.load_state_dict(
        {k: v for k, v in trunk.state_dict().items() if "freqs_cis" not in k}, strict=False)
    if unexpected or any("freqs_cis" not in k for k in missing):
        raise RuntimeError(f"the trunk's weights do not fit a {WINDOWS_2X2_IMAGE} px ViT: {missing} {unexpected}")
    side, g = WINDOWS_2X2_IMAGE, torch.Generator().manual_seed(seed + 1)
    D.case("vit_trunk_windows2x2", f"detector.backbone.vision_backbone.trunk (weights) in a {side} px ViT",
           f"shim.vit_trunk(config, {side})(images) -> [features]",
           {"images": (torch.rand(1, 3, side, side, generator=g) * 2 - 1).half().float()}, lambda images: wide(images))


def box_grounding(D: Dumper, det, trunk_out: dict, g: torch.Generator) -> None:
    """The grounding head with box prompts, as a boxes add_prompt runs it on its frame (Meta's
    _get_visual_prompt: normalised cxcywh boxes with labels in a Prompt, seq-first). Last of the cases, so
    the seeded inputs of every earlier case stay what they were. At T=2 image 1 has one padded box
    (box_mask True), so the padding rule is seen too; the text is "<text placeholder>" at T=1 (what a
    boxes-only add_prompt encodes) and "bike" at T=2."""
    for T, K, text in ((1, 2, "<text placeholder>"), (2, 3, "bike")):
        img = trunk_out[T][0]
        center = torch.rand(K, T, 2, generator=g) * 0.5 + 0.25
        size = torch.rand(K, T, 2, generator=g) * 0.4 + 0.1
        boxes = torch.cat([center, size], -1)
        labels = (torch.arange(K * T).view(K, T) % 3 != 2).long()  # positives and one negative per image
        mask = torch.zeros(T, K, dtype=torch.bool)
        if T > 1:
            mask[1, -1] = True

        def grounding(images, text_ids, img_ids, boxes, box_labels, box_mask, _text=[text, "visual", "geometric"]):
            from sam3.model.geometry_encoders import Prompt

            with torch.inference_mode():
                bo = {"img_batch_all_stages": images}
                bo.update(det.backbone.forward_image(images, need_interactive_out=False,
                                                     need_propagation_out=False))
                bo.update(det.backbone.forward_text(_text, device=torch.device("cpu")))
                prompt = Prompt(box_embeddings=boxes, box_mask=box_mask, box_labels=box_labels)
                out = det.forward_grounding(backbone_out=bo, find_input=_FindInput(img_ids=img_ids, text_ids=text_ids),
                                            find_target=None, geometric_prompt=prompt)
            keep = ("pred_logits", "pred_boxes", "pred_boxes_xyxy", "pred_masks", "presence_logit_dec")
            return {k: out[k] for k in keep if k in out}

        D.case(f"box_grounding_T{T}_K{K}", "detector (forward_grounding)",
               "detector.forward_grounding(..., geometric_prompt=Prompt(box_embeddings [K,T,4] cxcywh, box_mask "
               f"[T,K] True = padding, box_labels [K,T])) on the text {text!r}",
               {"images": img, "text_ids": torch.zeros(T, dtype=torch.long), "img_ids": torch.arange(T, dtype=torch.long),
                "boxes": boxes, "box_labels": labels, "box_mask": mask},
               grounding,
               sub={"geometry_encoder": det.geometry_encoder, "transformer.encoder": det.transformer.encoder,
                    "segmentation_head": det.segmentation_head},
               note="the prompt is the 32 text tokens, then the K box tokens and the CLS token of the geometry "
                    "encoder (padded boxes masked)")


# ------------------------------------------------------------------------------------ tracker steps
# Whole tracker steps as the predictor runs them, through Meta's own composite methods: what one exported
# tracker graph must reproduce end to end (memory selection and temporal encodings, mux / demux, the
# multimask choice, the pointer rules, the bf16 storage), on seeded inputs built here. Frames are stored
# the way _run_single_frame_inference / _run_memory_encoder store them.
REMOVED, PADDING = -1116, -1  # multiplex_utils._REMOVED_NUM / _PADDING_NUM


def _assignments(buckets: list[list[int]]) -> list[list[int]]:
    """Buckets given as lists of 'o' (object), 'x' (removed hole) codes -> Meta's assignment table:
    objects numbered densely in bucket/slot order, -1116 for holes, -1 padding to 16 slots."""
    out, k = [], 0
    for b in buckets:
        row = []
        for code in b:
            if code == "o":
                row.append(k)
                k += 1
            else:
                row.append(REMOVED)
        out.append(row + [PADDING] * (16 - len(row)))
    return out


def _state(assignments):
    from sam3.model.multiplex_utils import MultiplexState

    return MultiplexState([list(map(int, r)) for r in assignments], torch.device("cpu"), torch.float32,
                          allowed_bucket_capacity=16)


def tracker_steps(D: Dumper, trk, vb, F: int, g: torch.Generator) -> None:
    HW = F * F
    C = 256

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    with torch.inference_mode():
        # the stored image_pos_enc of every frame and the current frame's: the propagation neck's sine
        # encoding of level 2, [HW, 1, C] (it depends on the shape only)
        sine = vb.position_encoding(torch.zeros(1, C, F, F)).flatten(2).permute(2, 0, 1)

    # --- propagation: _prepare_memory_conditioned_features + _forward_sam_heads (propagation path)
    def propagation(assignments, frames, is_cond, maskmem_features, image_features, obj_ptr,
                    current_features, high_res_s0, high_res_s1, frame_idx, num_frames, reverse,
                    obj_score_bias_shift=0.0):
        # the seeded weights score every slot at +0.11..+0.17; a case with the object-score head's output
        # bias shifted (restored after the call) has absent slots too (no_obj_ptr_linear, NO_OBJ_SCORE masks)
        head_bias = trk.sam_mask_decoder.pred_obj_score_head.layers[-1].bias
        saved = head_bias.detach().clone()
        head_bias.data += obj_score_bias_shift
        try:
            return _propagation(assignments, frames, is_cond, maskmem_features, image_features, obj_ptr,
                                current_features, high_res_s0, high_res_s1, frame_idx, num_frames, reverse)
        finally:
            head_bias.data.copy_(saved)

    def _propagation(assignments, frames, is_cond, maskmem_features, image_features, obj_ptr,
                     current_features, high_res_s0, high_res_s1, frame_idx, num_frames, reverse):
        ms = _state(assignments.tolist())
        B = ms.num_buckets
        output_dict = {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}}
        for i, (f, c) in enumerate(zip(frames.tolist(), is_cond.tolist())):
            output_dict["cond_frame_outputs" if c else "non_cond_frame_outputs"][f] = {
                "maskmem_features": maskmem_features[i],
                "maskmem_pos_enc": [torch.zeros(B, C, F, F)],  # unused by the decoupled attention
                "image_features": image_features[i], "image_pos_enc": sine, "obj_ptr": obj_ptr[i]}
        pix = trk._prepare_memory_conditioned_features(
            frame_idx=frame_idx, is_init_cond_frame=False, current_vision_feats=[current_features],
            current_vision_masks=[None], current_vision_pos_embeds=[sine], feat_sizes=[(F, F)],
            output_dict=output_dict, num_frames=num_frames, track_in_reverse=reverse, multiplex_state=ms)
        multimask = trk._use_multimask(False, None)
        out = trk._forward_sam_heads(backbone_features=pix, propagation_high_res_features=[high_res_s0, high_res_s1],
                                     multimask_output=multimask, objects_to_interact=list(range(ms.total_valid_entries)),
                                     multiplex_state=ms)
        return {"pix_feat_with_mem": pix, "multimask_output": multimask,
                "low_res_multimasks": out["low_res_multimasks"], "low_res_masks": out["low_res_masks"],
                "ious": out["ious"], "object_score_logits": out["object_score_logits"], "obj_ptr": out["obj_ptr"],
                "obj_ptr_stored": ms.mux(out["obj_ptr"]), "valid_object_mask": ms.get_valid_object_mask()}

    prop_cases = {
        # the first propagated frame after a birth: one memory (the conditioning frame), one pointer frame
        "B1_first": dict(buckets=[["o"] * 10], frame_idx=1, num_frames=8, reverse=False, cond=[0], non_cond=[]),
        # five conditioning frames (4 selected; 4 unselected and 6 frames back, so it counts as a non-cond
        # memory and pointer), future ones (tpos slot 6), a missing non-cond frame (7), a far pointer frame (1)
        "B2_hole": dict(buckets=[["o", "o", "o", "x"] + ["o"] * 12, ["o"] * 5], frame_idx=10, num_frames=30,
                        reverse=False, cond=[4, 7, 9, 11, 12], non_cond=[3, 5, 6, 8, 1]),
        # reverse tracking: memories and pointers from later frames, the pointer window ends at the clip end
        "B3_reverse": dict(buckets=[["o"] * 16, ["o"] * 6 + ["x", "x"] + ["o"] * 8, ["o"] * 5], frame_idx=5,
                           num_frames=12, reverse=True, cond=[8, 11], non_cond=[6, 7, 9]),
        # B2_hole's layout with the object-score bias shifted by -0.135: about half the slots absent
        "B2_absent": dict(buckets=[["o", "o", "o", "x"] + ["o"] * 12, ["o"] * 5], frame_idx=10, num_frames=30,
                          reverse=False, cond=[4, 7, 9, 11, 12], non_cond=[3, 5, 6, 8, 1], shift=-0.135),
    }
    for cname, c in prop_cases.items():
        assignments = torch.tensor(_assignments(c["buckets"]))
        B = assignments.shape[0]
        valid = (assignments >= 0).float()[:, :, None]
        frames = c["cond"] + c["non_cond"]
        n = len(frames)
        D.case(f"propagation_step_{cname}", "tracker.model (_prepare_memory_conditioned_features + _forward_sam_heads)",
               "pix = _prepare_memory_conditioned_features(frame_idx, is_init_cond_frame=False, "
               "current_vision_feats=[current_features], current_vision_pos_embeds=[sine level 2], output_dict "
               "built from frames/is_cond/maskmem_features/image_features/obj_ptr (image_pos_enc = the sine "
               "encoding), num_frames, track_in_reverse=reverse, MultiplexState(assignments)); "
               "_forward_sam_heads(pix, propagation_high_res_features=[s0, s1], multimask_output="
               "_use_multimask(False, None))",
               {"assignments": assignments, "frames": torch.tensor(frames),
                "is_cond": torch.tensor([True] * len(c["cond"]) + [False] * len(c["non_cond"])),
                # stored as Meta stores them: memories bf16 (the shim rounds), pointers muxed (0 in empty slots)
                "maskmem_features": randn(n, B, C, F, F).to(torch.bfloat16),
                "image_features": randn(n, HW, 1, C), "obj_ptr": randn(n, B, 16, C) * valid[None],
                "current_features": randn(HW, 1, C), "high_res_s0": randn(1, 32, 4 * F, 4 * F),
                "high_res_s1": randn(1, 64, 2 * F, 2 * F), "frame_idx": c["frame_idx"],
                "num_frames": c["num_frames"], "reverse": c["reverse"],
                "obj_score_bias_shift": c.get("shift", 0.0)},
               propagation,
               note="objects are numbered in bucket/slot order; outputs per object (demuxed) except "
                    "pix_feat_with_mem [B,256,F,F], obj_ptr_stored (mux) and valid_object_mask [B,16]")

    # --- memory encoder: _encode_new_memory, stored bf16 as _run_memory_encoder stores it
    def memory(assignments, pix_feat, pred_masks_high_res, object_score_logits, conditioning_objects):
        ms = _state(assignments.tolist())
        feats, _ = trk._encode_new_memory(
            image=None, current_vision_feats=[pix_feat], feat_sizes=[(F, F)], pred_masks_high_res=pred_masks_high_res,
            object_score_logits=object_score_logits, is_mask_from_pts=False,
            conditioning_objects=set(conditioning_objects.tolist()), multiplex_state=ms)
        return {"maskmem_features_fp32": feats.clone(), "maskmem_features": feats.to(torch.bfloat16)}

    mem_cases = {
        # births / clicks: 14F masks (the downsampler resizes them to 16F), two conditioning objects, one absent
        "H14F_B1": (14 * F, [["o"] * 10], [0, 3]),
        # a propagated frame: 16F masks, no conditioning object, a hole
        "H16F_B2": (16 * F, [["o"] * 6 + ["x"] + ["o"] * 9, ["o"] * 4], []),
        # holes left by removals in every bucket, one conditioning object in the last
        "H16F_B3": (16 * F, [["o", "x"] * 3, ["x", "o", "o"], ["o"] * 3], [7]),
    }
    for cname, (H, buckets, cond) in mem_cases.items():
        assignments = torch.tensor(_assignments(buckets))
        N = int((assignments >= 0).sum())
        low = randn(N, 1, 4 * F, 4 * F, scale=4)
        masks = torch.nn.functional.interpolate(low, size=(H, H), mode="bilinear", align_corners=False)
        scores = torch.where(torch.arange(N) % 3 == 1, -10.0, 10.0)[:, None]
        masks[1::3] = torch.clamp(masks[1::3], max=-10.0)  # suppressed objects, as the area-shrinkage rule leaves them
        masks[-1] = -1024.0  # an absent object: NO_OBJ_SCORE masks
        scores[-1] = -10.0
        D.case(f"memory_encoder_step_{cname}", "tracker.model (_encode_new_memory)",
               "_encode_new_memory(image=None, current_vision_feats=[pix_feat], pred_masks_high_res (logits), "
               "object_score_logits, is_mask_from_pts=False, conditioning_objects, MultiplexState(assignments)); "
               "maskmem_features = .to(bfloat16) as _run_memory_encoder stores it",
               {"assignments": assignments, "pix_feat": randn(HW, 1, C), "pred_masks_high_res": masks,
                "object_score_logits": scores, "conditioning_objects": torch.tensor(cond, dtype=torch.long)},
               memory)

    # --- births: detector logits (4F) -> bilinear 16F > 0 -> _use_mask_as_output on the interactive head
    def birth(interactive_feat, high_res_s0, high_res_s1, mask_logits):
        n = mask_logits.shape[0]
        # sam3_multiplex_base._tracker_add_new_objects / _recondition_masklets
        size = trk.input_mask_size
        mask_inputs = (torch.nn.functional.interpolate(mask_logits, size=(size, size), mode="bilinear",
                                                       align_corners=False) > 0).float()
        pix = trk._get_interactive_pix_mem([interactive_feat.flatten(2).permute(2, 0, 1)], [(F, F)])
        ms = trk.multiplex_controller.get_state(num_valid_entries=n, device=torch.device("cpu"),
                                                dtype=torch.float32, random=False)
        out = trk._use_mask_as_output(backbone_features=pix, high_res_features=[high_res_s0, high_res_s1],
                                      mask_inputs=mask_inputs, multiplex_state=ms, objects_in_mask=list(range(n)))
        return {"mask_inputs": mask_inputs, "low_res_masks": out["low_res_masks"],
                "object_score_logits": out["object_score_logits"], "obj_ptr": out["obj_ptr"]}

    for n in (1, 4):
        blobs = torch.nn.functional.avg_pool2d(randn(n, 1, 4 * F, 4 * F), 5, stride=1, padding=2) > 0.15
        logits = torch.where(blobs, 6.0, -7.0)  # two-valued: the 16F upsampling never lands on 0
        if n > 1:
            logits[-1] = -7.0  # an empty detection: the object starts absent
        D.case(f"mask_init_step_n{n}", "tracker.model (_use_mask_as_output)",
               "mask_inputs = interpolate(mask_logits, 16F, bilinear) > 0 (the births' and reconditioning's "
               "preprocessing); _use_mask_as_output(_get_interactive_pix_mem(interactive_feat), [s0, s1], "
               "mask_inputs, get_state(n))",
               {"interactive_feat": randn(1, C, F, F), "high_res_s0": randn(1, 32, 4 * F, 4 * F),
                "high_res_s1": randn(1, 64, 2 * F, 2 * F), "mask_logits": logits}, birth)

    # --- clicks: the memory-free interactive head, _forward_sam_heads with point (and mask) inputs
    def clicks(interactive_feat, high_res_s0, high_res_s1, point_coords, point_labels, mask_inputs,
               is_init_cond_frame):
        n = point_coords.shape[0]
        pix = trk._get_interactive_pix_mem([interactive_feat.flatten(2).permute(2, 0, 1)], [(F, F)])
        ms = trk.multiplex_controller.get_state(num_valid_entries=n, device=torch.device("cpu"),
                                                dtype=torch.float32, random=False)
        point_inputs = {"point_coords": point_coords, "point_labels": point_labels}
        multimask = trk._use_multimask(is_init_cond_frame, point_inputs)
        out = trk._forward_sam_heads(backbone_features=pix, point_inputs=point_inputs, mask_inputs=mask_inputs,
                                     interactive_high_res_features=[high_res_s0, high_res_s1],
                                     multimask_output=multimask, objects_to_interact=list(range(n)),
                                     multiplex_state=ms)
        return {"multimask_output": multimask, "low_res_multimasks": out["low_res_multimasks"],
                "low_res_masks": out["low_res_masks"], "ious": out["ious"],
                "object_score_logits": out["object_score_logits"], "obj_ptr": out["obj_ptr"]}

    S = trk.image_size
    box = torch.sort(torch.rand(3, 2, 2, generator=g) * S, dim=1).values  # x0<=x1, y0<=y1 corners
    click_cases = {
        "n1_click": (torch.rand(1, 1, 2, generator=g) * S, torch.tensor([[1]], dtype=torch.int32), None),
        "n3_box_clicks": (torch.cat([box, torch.rand(3, 2, 2, generator=g) * S], 1),
                          torch.tensor([[2, 3, 1, 0]] * 3, dtype=torch.int32), None),
        # a refinement: the previous low-res logits (clamped to +-32, as add_new_points does) as mask prompt
        "n2_clicks_mask": (torch.rand(2, 2, 2, generator=g) * S, torch.tensor([[1, 0], [1, 1]], dtype=torch.int32),
                           torch.clamp(randn(2, 1, 4 * F, 4 * F, scale=20), -32.0, 32.0)),
    }
    for cname, (pts, lab, mask) in click_cases.items():
        D.case(f"interactive_step_{cname}", "tracker.model (_forward_sam_heads, interactive path)",
               "_forward_sam_heads(_get_interactive_pix_mem(interactive_feat), point_inputs, mask_inputs, "
               "interactive_high_res_features=[s0, s1], multimask_output=_use_multimask(is_init_cond_frame, "
               "point_inputs), get_state(n))",
               {"interactive_feat": randn(1, C, F, F), "high_res_s0": randn(1, 32, 4 * F, 4 * F),
                "high_res_s1": randn(1, 64, 2 * F, 2 * F), "point_coords": pts, "point_labels": lab,
                "mask_inputs": mask, "is_init_cond_frame": True}, clicks)


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
    D = run(pred, a.out, a.seed, config)
    common.write_json(a.out / "index.json", {
        "checkpoint": str(a.checkpoint), "config": config, "numerics": numerics, "seed": a.seed,
        "facts": common.run_facts(a.threads), "total_s": round(time.time() - t0, 2), "cases": D.index})
    print(f"done: {len(D.index)} cases in {time.time() - t0:.1f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
