"""The graph wrappers of SAM 3.1's tracker, one per exported graph (graphs/sam31/tracker.py lists them;
inputs and outputs in graphs/sam31/tracker_specs.py), built on Sam31Tracker (tracker_model.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import NO_OBJ_SCORE, channels_as_objects, objects_as_channels, resize_antialiased, round_to_bfloat16
from .tracker_model import Sam31Tracker
from .tracker_parts import (MASK_INPUT_BIAS, MASK_INPUT_SCALE, SIGMOID_BIAS_FOR_MEM_ENC, SIGMOID_SCALE_FOR_MEM_ENC,
                            STABILITY_THRESH, sine_1d, stability_scores, take_best)


class TrackerGraph(nn.Module):
    """Base of the graph wrappers: holds the tracker; ``attention_mode`` (ops.ATTENTION_MODES) is set by
    the exporter and reaches the memory attention (the two-way transformers are switched by
    ops.transformers_attention around the export)."""

    def __init__(self, tracker: Sam31Tracker):
        super().__init__()
        self.trk = tracker

    @property
    def attention_mode(self):
        return self.trk.memory_attention.attention_mode

    @attention_mode.setter
    def attention_mode(self, mode):
        self.trk.memory_attention.attention_mode = mode


class PropagationDecoder(TrackerGraph):
    """One propagation step for B buckets (Meta's _prepare_memory_conditioned_features + _forward_sam_heads
    on the propagation path), every bucket's memories and pointers gathered from the pools by index.

    Per bucket b and memory entry j: memory_pool[memory_index[b, j]] is the bucket's stored memory map of
    one frame, image_pool[memory_image_index[b, j]] the stored image features of that same frame,
    memory_slot[b, j] its temporal-encoding index (maskmem_tpos_enc row, Meta's tpos v2), memory_valid 1/0.
    Per pointer entry j: pointer_pool[pointer_index[b, j]] holds the bucket's 16 slot pointers of one frame,
    pointer_offset[b, j] = |frame distance| / (min(num_frames, 16) - 1), pointer_valid 1/0.
    slot_valid [B, 16]: 1 where the slot holds an object (not padding, not a removed hole).

    Outputs per bucket and slot, as Meta's propagation step leaves them before demux: low_res_masks (the
    best of the 3 by predicted IoU; NO_OBJ_SCORE where the object score is <= 0), iou_scores (the 3 raw
    IoU predictions), object_score_logits, object_pointer (0 in empty slots: what Meta stores, mux).
    """

    def forward(self, tracker_feat_s0, tracker_feat_s1, tracker_feat, memory_pool, image_pool, pointer_pool,
                memory_index, memory_image_index, memory_slot, memory_valid, pointer_index, pointer_offset,
                pointer_valid, slot_valid):
        trk = self.trk
        b, n = memory_index.shape
        p = pointer_index.shape[1]
        c, g, k = trk.channels, trk.grid, trk.slots
        hw = g * g
        current = tracker_feat.flatten(2).transpose(1, 2)  # [1, HW, C]

        memory = memory_pool[memory_index.reshape(-1)].reshape(b, n * hw, c)
        memory_image = image_pool[memory_image_index.reshape(-1)].reshape(b, n * hw, c)
        tpos = trk.maskmem_tpos_enc.reshape(-1, c)[memory_slot.reshape(-1)].reshape(b, n, 1, c)
        # Meta: image_pos_enc (the sine encoding) + maskmem_tpos_enc[slot] for every stored frame
        memory_image_pos = (trk.image_pos[:, None] + tpos).reshape(b, n * hw, c)

        pointers = pointer_pool[pointer_index.reshape(-1)].reshape(b, p * k, c)
        pointer_pos = trk.obj_ptr_tpos_proj(sine_1d(pointer_offset, trk.obj_ptr_tpos_proj.in_features))  # [B, P, C]: one per pointer frame,
        pointer_pos = pointer_pos[:, :, None, :].expand(b, p, k, c).reshape(b, p * k, c)  # shared by its 16 slots

        valid = torch.cat([memory_valid[:, :, None].expand(b, n, hw).reshape(b, n * hw),
                           pointer_valid[:, :, None].expand(b, p, k).reshape(b, p * k)], dim=1)
        conditioned = trk.memory_attention(current, trk.image_pos, memory, memory_image, memory_image_pos,
                                           pointers, pointer_pos, valid)
        pix_feat = conditioned.transpose(1, 2).reshape(b, c, g, g)

        slot_valid_ = slot_valid[:, :, None]
        slot_embed = slot_valid_ * trk.output_valid_embed + (1 - slot_valid_) * trk.output_invalid_embed
        masks, iou, score, tokens = trk.mask_decoder(pix_feat, trk.propagation_dense_pe, tracker_feat_s0,
                                                     tracker_feat_s1, slot_embed)
        masks = torch.where((score > 0)[..., None, None], masks, torch.full((), NO_OBJ_SCORE))
        # multimask_output is always on in propagation (_use_multimask(False, None)): best predicted IoU
        best = torch.argmax(iou, dim=-1)  # [B, K]
        low_res = take_best(masks, best, axis=2)[:, :, None]  # [B, K, 1, 4F, 4F]
        pointer = trk.pointer(trk.obj_ptr_proj, take_best(tokens, best, axis=2), score)
        return low_res, iou, score, pointer * slot_valid_


class MemoryEncoder(TrackerGraph):
    """One memory map per bucket (Meta's _encode_new_memory for the buckets of a tracker state, stored
    bf16 as _run_memory_encoder stores it).

    mask_logits [B, 16, h, h] at h = 14F (births / clicks: the consolidated masks) or 16F (propagated
    frames: low-res logits upsampled by the caller, after its non-overlap rules), one slot per plane;
    slot_valid [B, 16]; conditioning [B, 16] (1 = in the frame's conditioning_objects);
    object_score_logits [B, 16]. As Meta muxes them, empty slots give mask 0 (not -1), conditioning 0 and a
    score of 0, so they add no_obj_embed_spatial[slot] like absent objects do.
    Outputs maskmem_features [B, HW, C] (rounded to bfloat16: one memory_pool row per bucket) and
    image_features [1, HW, C] (the frame's features in the image_pool row layout).
    """

    def forward(self, tracker_feat, mask_logits, slot_valid, conditioning, object_score_logits):
        trk = self.trk
        b, k, h, w = mask_logits.shape
        valid = slot_valid[:, :, None, None] > 0.5
        prob = torch.sigmoid(mask_logits) * SIGMOID_SCALE_FOR_MEM_ENC + SIGMOID_BIAS_FOR_MEM_ENC
        masks = torch.where(valid, prob, torch.zeros((), dtype=prob.dtype))
        cond = (conditioning * slot_valid)[:, :, None, None].expand(b, k, h, w)
        features = trk.memory_encoder(tracker_feat, torch.cat([masks, cond], dim=1))  # [B, C, F, F]
        absent = 1.0 - (object_score_logits > 0).to(features.dtype) * slot_valid
        no_obj = (absent[:, :, None] * trk.no_obj_embed_spatial).sum(dim=1)  # [B, C]
        features = round_to_bfloat16(features + no_obj[:, :, None, None])
        return features.flatten(2).transpose(1, 2), tracker_feat.flatten(2).transpose(1, 2)


def select_outputs(trk, masks, iou, tokens, score, multimask):
    """Meta's interactive choice per row: multimask rows take the best of masks 1..3 by predicted IoU (and
    its token); single-mask rows take mask 0, or the best multimask when mask 0 is unstable
    (dynamic_multimask_via_stability), with token 0 either way. Masks of absent rows -> NO_OBJ_SCORE.
    Returns low_res [N, 1, L, L], iou [N, 3] (single rows: their one score in every column), pointer."""
    best = torch.argmax(iou[:, 1:], dim=-1)  # [N]
    best_mask, best_iou = take_best(masks[:, 1:], best, 1), take_best(iou[:, 1:], best, 1)
    stable = stability_scores(masks[:, 0]) >= STABILITY_THRESH  # [N]
    single_mask = torch.where(stable[:, None, None], masks[:, 0], best_mask)
    single_iou = torch.where(stable, iou[:, 0], best_iou)
    pick = multimask > 0.5
    low_res = torch.where(pick[:, None, None], best_mask, single_mask)
    low_res = torch.where((score > 0)[:, :, None], low_res, torch.full((), NO_OBJ_SCORE))[:, None]
    iou_out = torch.where(pick[:, None], iou[:, 1:], single_iou[:, None].expand_as(iou[:, 1:]))
    token = torch.where(pick[:, None], take_best(tokens[:, 1:], best, 1), tokens[:, 0])
    return low_res, iou_out, trk.pointer(trk.interactive_obj_ptr_proj, token, score)


class InteractiveDecoder(TrackerGraph):
    """Clicks and boxes for N objects on one frame (Meta's _forward_sam_heads, interactive path): the
    memory-free interactive head (interactive neck + interactivity_no_mem_embed), the prompt encoder with
    the points (box = corners labelled 2 / 3; -1 = padding point), an optional mask prompt (the previous
    low-res logits of a refinement, clamped by the caller as Meta clamps them to +-32).

    point_coords [N, P, 2] (x, y in model-input pixels), point_labels [N, P] int32; mask_prompt
    [N, 1, 4F, 4F], use_mask_prompt [N] (0: the prompt encoder's no_mask_embed); multimask [N] (Meta's
    _use_multimask: 1 for 0 or 1 points, else 0). Both choices are computed for every row.
    Outputs low_res_masks [N, 1, L, L], iou_scores [N, 3], object_score_logits [N, 1],
    object_pointer [N, C] (interactive_obj_ptr_proj; no_obj_ptr_linear where absent).
    """

    def forward(self, interactive_feat_s0, interactive_feat_s1, interactive_feat, point_coords, point_labels,
                mask_prompt, use_mask_prompt, multimask):
        trk = self.trk
        sparse = trk.sparse_points(point_coords, point_labels)
        dense_mask = trk.prompt_encoder.mask_embed(mask_prompt)
        no_mask = trk.prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1)
        dense = torch.where(use_mask_prompt[:, None, None, None] > 0.5, dense_mask, no_mask)
        masks, iou, tokens, score = trk.interactive_head(trk.interactive_pix(interactive_feat), trk.interactive_dense_pe,
                                                         sparse, dense, interactive_feat_s0, interactive_feat_s1)
        low_res, iou_out, pointer = select_outputs(trk, masks, iou, tokens, score, multimask)
        return low_res, iou_out, score, pointer


class MaskInit(TrackerGraph):
    """New objects (births) and reconditioning from detector mask logits (Meta's _use_mask_as_output).

    mask_logits [N, 1, 4F, 4F]: the detector's low-res logits (or the reconditioned mask). As Meta
    prepares them: bilinear to 16F, > 0. The binary mask becomes the output (-10 / +10 logits, antialiased
    to 4F); interactive_mask_downsample of it is the mask prompt of the interactive head (one -1 point,
    single-mask output), whose token 0 gives the pointer.
    Outputs low_res_masks [N, 1, 4F, 4F], object_pointer [N, C], object_score_logits [N, 1] (+10 for a
    non-empty mask, -10 for an empty one).
    """

    def forward(self, interactive_feat, mask_logits):
        trk = self.trk
        n = mask_logits.shape[0]
        size = 16 * trk.grid  # input_mask_size
        # the objects as channels through both resizes: OpenVINO vectorises its resize over channels
        planes = F.interpolate(objects_as_channels(mask_logits), size=(size, size), mode="bilinear",
                               align_corners=False)
        planes = (planes > 0).float()
        low_res = channels_as_objects(resize_antialiased(planes * MASK_INPUT_SCALE + MASK_INPUT_BIAS,
                                                         (4 * trk.grid, 4 * trk.grid)))
        mask = channels_as_objects(planes)
        prompt = trk.interactive_mask_downsample(mask)
        points = torch.zeros(n, 1, 2, dtype=mask.dtype)
        labels = -torch.ones(n, 1, dtype=torch.int32)
        _, _, tokens, score = trk.interactive_head(trk.interactive_pix(interactive_feat), trk.interactive_dense_pe,
                                                   trk.sparse_points(points, labels),
                                                   trk.prompt_encoder.mask_embed(prompt), with_masks=False)
        pointer = trk.pointer(trk.interactive_obj_ptr_proj, tokens[:, 0], score)  # multimask off: token 0
        # Meta applies the no-object rule a second time, now by the mask's emptiness, to the pointer that
        # already went through it by the decoder's score: an empty mask whose decoder score is <= 0 gets
        # no_obj_ptr_linear twice (its comment calls this harmless; it is not idempotent)
        visible = (mask.flatten(1) > 0).any(dim=1, keepdim=True).to(pointer.dtype)
        pointer = visible * pointer + (1 - visible) * trk.no_obj_ptr_linear(pointer)
        return low_res, pointer, visible * MASK_INPUT_SCALE + MASK_INPUT_BIAS


GRAPH_MODULES = {"propagation_decoder": PropagationDecoder, "memory_encoder": MemoryEncoder,
                 "interactive_decoder": InteractiveDecoder, "mask_init": MaskInit}
