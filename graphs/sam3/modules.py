"""The exported graphs: thin torch wrappers around transformers' SAM 3 video modules.

Each wrapper takes and returns plain tensors, so that ``torch.onnx.export`` sees a fixed signature.
Boundaries follow the predictor that calls them (``sam3track/families/sam3/frame_loop.py``). Each graph's
role and how often it runs: docs/architecture.md ("Graphs of a bundle" and the paragraph after it).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import (NO_OBJ_SCORE, attention, channels_as_objects, objects_as_channels, resize_antialiased,
                   round_to_bfloat16)


def sam_decode(trk, pix_feat, high_res, points, labels, multimask: bool, mask_prompt=None):
    """The tracker's SAM prompt encoder + mask decoder for a batch of objects, one prompt per object.

    points [N, 1, P, 2] (model-input pixels) and labels [N, 1, P] int32; the prompt encoder appends its
    (0, 0) / -1 pad point itself, as ``_single_frame_forward`` without boxes has it do. Masks of objects
    whose score says absent are filled with NO_OBJ_SCORE, as the reference does before any selection.
    Returns masks [N, M, L, L], iou [N, M], mask tokens [N, M, C], object_score_logits [N, 1] with
    M = 3 for multimask output, else 1 (the decoder's dynamic_multimask_via_stability applied).
    """
    n = pix_feat.shape[0]
    image_pos = trk.get_image_wide_positional_embeddings().expand(n, -1, -1, -1)
    sparse, dense = trk.prompt_encoder(input_points=points, input_labels=labels, input_boxes=None,
                                       input_masks=mask_prompt)
    masks, iou, tokens, scores = trk.mask_decoder(
        image_embeddings=pix_feat, image_positional_embeddings=image_pos, sparse_prompt_embeddings=sparse,
        dense_prompt_embeddings=dense, multimask_output=multimask, high_resolution_features=high_res)
    masks, iou, tokens, scores = masks[:, 0], iou[:, 0], tokens[:, 0], scores[:, 0]  # one prompt per object
    masks = torch.where((scores > 0)[:, :, None, None], masks, torch.full((), NO_OBJ_SCORE))
    return masks, iou, tokens, scores


def best_of(masks, iou, tokens):
    """Per row, the mask [N, 1, L, L] and token [N, C] of the highest predicted IoU.

    ``_single_frame_forward`` indexes with broadcast batch indices, which is only correct for batch 1;
    this is its per-row meaning.
    """
    best = torch.argmax(iou, dim=-1)  # [N]
    rows = torch.arange(iou.shape[0])  # not masks' shape: a graph that needs only the token drops the masks
    return masks[rows, best][:, None], tokens[rows, best]


def object_pointer(trk, token, scores):
    """The object pointer of a SAM output token [N, C]; absent objects get the no-object pointer."""
    pointer = trk.object_pointer_proj(token)
    visible = (scores > 0).to(pointer.dtype)
    return visible * pointer + (1 - visible) * trk.no_object_pointer


def sam_head(trk, pix_feat, high_res, multimask: bool, mask_prompt=None):
    """The SAM head with no points, as ``Sam3TrackerVideoModel._single_frame_forward`` runs it for
    tracked frames (a -1 point only). Returns low_res_masks [N, 1, L, L], iou_scores [N, M],
    object_score_logits [N, 1], pointer [N, C].
    """
    n = pix_feat.shape[0]
    points = torch.zeros(n, 1, 1, 2, dtype=pix_feat.dtype)
    labels = -torch.ones(n, 1, 1, dtype=torch.int32)
    masks, iou, tokens, scores = sam_decode(trk, pix_feat, high_res, points, labels, multimask, mask_prompt)
    if multimask:
        low_res, token = best_of(masks, iou, tokens)
    else:
        low_res, token = masks[:, :1], tokens[:, 0]
    return low_res, iou, scores, object_pointer(trk, token, scores)


# ----------------------------------------------------------------------------------------------- text
class TextEncoder(nn.Module):
    """input_ids, attention_mask [M, T] -> text_features [M, T, D] (projected to the DETR width)."""

    def __init__(self, model):
        super().__init__()
        self.detector = model.detector_model

    def forward(self, input_ids, attention_mask):
        return self.detector.get_text_features(input_ids=input_ids, attention_mask=attention_mask).pooler_output


# ------------------------------------------------------------------------------------------- backbone
def _neck_levels(neck, spatial: torch.Tensor, count: int) -> list[torch.Tensor]:
    return [layer(spatial) for layer in neck.fpn_layers[:count]]


class Backbone(nn.Module):
    """pixel_values [I, 3, S, S] -> the detector head (3 FPN levels) and the tracker head.

    The tracker head is the tracker neck's first three levels with the SAM decoder's conv_s0/conv_s1
    already applied to the two high-resolution levels (as the reference precomputes them).
    """

    DETECTOR_OUTPUTS = ("detector_fpn0", "detector_fpn1", "detector_fpn2")
    TRACKER_OUTPUTS = ("tracker_feat_s0", "tracker_feat_s1", "tracker_feat")

    def __init__(self, model):
        super().__init__()
        vision = model.detector_model.vision_encoder
        self.trunk = vision.backbone
        self.patch = vision.config.backbone_config.patch_size
        self.detector_neck = vision.neck
        self.tracker_neck = model.tracker_neck
        self.conv_s0 = model.tracker_model.mask_decoder.conv_s0
        self.conv_s1 = model.tracker_model.mask_decoder.conv_s1

    def forward(self, pixel_values):
        hidden = self.trunk(pixel_values).last_hidden_state
        batch = hidden.shape[0]
        h, w = pixel_values.shape[-2] // self.patch, pixel_values.shape[-1] // self.patch
        spatial = hidden.view(batch, h, w, -1).permute(0, 3, 1, 2)
        det = _neck_levels(self.detector_neck, spatial, 3)
        trk = _neck_levels(self.tracker_neck, spatial, 3)
        return (*det, self.conv_s0(trk[0]), self.conv_s1(trk[1]), trk[2])


# ---------------------------------------------------------------------------------------- grounding
class GroundingHead(nn.Module):
    """One image's detector features + K prompts -> detections per prompt (output k is prompt k)."""

    def __init__(self, model):
        super().__init__()
        self.detector = model.detector_model
        neck = self.detector.vision_encoder.neck
        sizes = model.config.detector_config.vision_config.backbone_feature_sizes
        c = model.config.detector_config.vision_config.fpn_hidden_size
        self.pos = [neck.position_encoding((1, c, h, w), "cpu", torch.float32) for h, w in sizes]

    def forward(self, detector_fpn0, detector_fpn1, detector_fpn2, text_features, text_mask):
        from transformers.models.sam3.modeling_sam3 import Sam3VisionEncoderOutput

        k = text_features.shape[0]
        levels = [f.expand(k, -1, -1, -1) for f in (detector_fpn0, detector_fpn1, detector_fpn2)]
        pos = [p.expand(k, -1, -1, -1) for p in self.pos]
        # The detector drops the last FPN level itself; a placeholder keeps its indexing intact.
        vision = Sam3VisionEncoderOutput(fpn_hidden_states=(*levels, None), fpn_position_encoding=(*pos, None))
        text = types.SimpleNamespace(pooler_output=text_features)
        out = self.detector(vision_embeds=vision, text_embeds=text, attention_mask=text_mask)
        return out.pred_logits, out.presence_logits, out.pred_boxes, out.pred_masks


# -------------------------------------------------------------------------------------- propagation
def _rope(x, cos, signed_sin):
    """RoPE on the last axis: x * cos + rotate_pairwise(x) * sin, with rotate_pairwise's negation folded
    into ``signed_sin`` so the rotation is one pair swap (bit for bit the same products)."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return x * cos + swapped * signed_sin


class MemoryConditioning(nn.Module):
    """The tracker's memory attention for N objects in one call (``_prepare_memory_conditioned_features``
    batched): each object's memories and pointers are gathered from device pools by index and padding
    is masked, so an object with fewer entries gets what a one-object call gives. Shared by the
    propagation and interactive decoders.
    """

    def __init__(self, model):
        super().__init__()
        trk = model.tracker_model
        self.trk = trk
        self.attn = trk.memory_attention
        h, w = trk.backbone_feature_sizes[-1]
        self.hw = (h, w)
        self.c = trk.hidden_dim
        self.mem_dim = trk.mem_dim
        neck = model.tracker_neck
        self.vision_pos = neck.position_encoding((1, self.c, h, w), "cpu", torch.float32).flatten(2)[0].t()
        mem_pos = trk.memory_encoder.position_encoding((1, self.mem_dim, h, w), "cpu", torch.float32)
        self.memory_pos = mem_pos.flatten(2)[0].t()  # [HW, Cm], identical for every memory
        self.temporal_pointer_pe = trk.config.enable_temporal_pos_encoding_for_object_pointers
        self.attention_mode = "plain"  # graphs.export sets the mode it was asked for (ATTENTION_MODES)

    def _pointer_tokens(self, pointers, offsets):
        """[N, P, C] pointers -> [N, P*C/Cm, Cm] tokens and their positional encodings (no RoPE)."""
        from transformers.models.sam3_tracker_video.modeling_sam3_tracker_video import get_1d_sine_pe

        n, p, c = pointers.shape
        if self.temporal_pointer_pe:
            pos = self.trk.temporal_positional_encoding_projection_layer(get_1d_sine_pe(offsets, dim=c))
        else:
            pos = torch.zeros(n, p, self.mem_dim, dtype=pointers.dtype)
        splits = c // self.mem_dim
        if splits > 1:
            pointers = pointers.reshape(n, p * splits, self.mem_dim)
            pos = pos.repeat_interleave(splits, dim=1)
        return pointers, pos, splits

    def _memory_attention(self, current, memory, memory_pos, valid, num_spatial):
        """Batched copy of Sam3TrackerVideoMemoryAttention.forward with a key padding mask.

        current [1, HW, C] is the same for every object until the first cross-attention, so the first
        layer's self-attention runs once, not once per object.
        """
        attn = self.attn
        cos, sin = attn.rotary_emb(current, attn.position_ids)
        output = current + 0.1 * self.vision_pos
        repeats = num_spatial // current.shape[1]
        for layer in attn.layers:
            q_in = layer.layer_norm1(output)
            output = output + self._rope_attention(layer.self_attn, q_in, q_in, q_in, cos, sin, None, 1, False)
            q_in = layer.layer_norm2(output)
            output = output + self._rope_attention(
                layer.cross_attn_image, q_in, memory + memory_pos, memory, cos, sin, valid, repeats
            )
            q_in = layer.layer_norm3(output)
            output = output + layer.linear2(layer.activation(layer.linear1(q_in)))
        return attn.layer_norm(output)

    def _rope_attention(self, module, query, key, value, cos, sin, valid, key_repeats, pointers=True):
        """One attention of a memory-attention layer, RoPE on queries and on the first HW*key_repeats keys
        (spatial memories; pointer tokens after them, if ``pointers``, get none). Tensors stay
        [batch, sequence, heads, head_dim]: no transposes, and the RoPE tables broadcast over memories."""
        n = key.shape[0]  # query may be one row shared by every object
        heads, head_dim = module.num_attention_heads, module.head_dim
        hw = cos.shape[-2]
        cos = cos.reshape(hw, 1, head_dim)
        signed_sin = sin.reshape(hw, 1, head_dim) * torch.tensor([-1.0, 1.0]).repeat(head_dim // 2)
        q = _rope(module.q_proj(query).unflatten(-1, (heads, head_dim)), cos, signed_sin).expand(n, -1, -1, -1)
        k = module.k_proj(key).unflatten(-1, (heads, head_dim))  # [N, L, H, D]
        if pointers:
            # RoPE on the spatial keys only, without slicing them out: the pair swap comes from a second
            # projection with swapped output rows (cheap: keys are 64 wide), and the pointer tokens
            # get the identity rotation (cos 1, sin 0). The same products as _rope, bit for bit.
            proj = module.k_proj
            swap = torch.arange(proj.out_features).reshape(-1, 2).flip(-1).reshape(-1)
            k_swapped = F.linear(key, proj.weight[swap], proj.bias[swap]).unflatten(-1, (heads, head_dim))
            others = key.shape[1] - hw * key_repeats
            cos_k = torch.cat([cos.repeat(key_repeats, 1, 1), cos.new_ones(others, 1, head_dim)])
            sin_k = torch.cat([signed_sin.repeat(key_repeats, 1, 1), cos.new_zeros(others, 1, head_dim)])
            k = k * cos_k + k_swapped * sin_k
        else:
            k = _rope(k, cos, signed_sin)
        v_proj = module.v_proj
        if heads == 1 and v_proj.in_features < v_proj.out_features:
            # Softmax rows sum to 1, so softmax(..) @ (X W + b) == (softmax(..) @ X) W + b: attending over
            # the 64-wide memories and projecting after costs a quarter of attending over 256-wide values.
            out = v_proj(attention(q, k, value[:, :, None], valid, module.scaling, self.attention_mode))
        else:
            v = v_proj(value).unflatten(-1, (heads, head_dim))
            out = attention(q, k, v, valid, module.scaling, self.attention_mode)
        return module.o_proj(out)

    def condition(self, tracker_feat, memory_pool, memory_index, memory_slot, memory_valid, pointer_pool,
                  pointer_index, pointer_offset, pointer_valid):
        """Memory-conditioned pixel features [N, C, H, W] of the current frame for every object."""
        n, k = memory_index.shape
        h, w = self.hw
        hw = h * w
        current = tracker_feat.flatten(2).transpose(1, 2)  # [1, HW, C]

        memory = memory_pool[memory_index.reshape(-1)].reshape(n, k * hw, self.mem_dim)
        temporal = self.trk.memory_temporal_positional_encoding.reshape(-1, self.mem_dim)[memory_slot]
        memory_pos = (self.memory_pos[None, None] + temporal[:, :, None, :]).reshape(n, k * hw, self.mem_dim)
        pointers = pointer_pool[pointer_index]  # [N, P, C]
        ptr_tokens, ptr_pos, splits = self._pointer_tokens(pointers, pointer_offset)
        keys = torch.cat([memory, ptr_tokens], dim=1)
        keys_pos = torch.cat([memory_pos, ptr_pos], dim=1)
        valid = torch.cat(
            [memory_valid.repeat_interleave(hw, dim=1), pointer_valid.repeat_interleave(splits, dim=1)], dim=1
        )
        conditioned = self._memory_attention(current, keys, keys_pos, valid, k * hw)
        return conditioned.transpose(1, 2).reshape(n, self.c, h, w)


class PropagationDecoder(MemoryConditioning):
    """Memory attention + SAM mask decoder for N objects in one call.

    Inputs (N objects, K memory frames, P object pointers, all padded; *_valid marks real entries):
      tracker_feat_s0/_s1/tracker_feat [1, C*, H*, W*]: the current frame's tracker head.
      memory_pool [Sm, HW, Cm]: spatial memories (stored bf16-rounded, as the reference stores them).
      memory_index [N, K] int32: rows of memory_pool for each object.
      memory_slot [N, K] int32: temporal slot of each memory (index into the temporal encodings; the
        reference uses slot num_maskmem-1 for conditioning frames and t-1 for a frame t steps away).
      memory_valid [N, K] float32: 1 for real entries, 0 for padding.
      pointer_pool [Sp, C]: object pointers. pointer_index [N, P] int32, pointer_valid [N, P] float32.
      pointer_offset [N, P] float32: signed frame distance divided by (max pointers used - 1).
    Outputs: low_res_masks [N, 1, L, L], iou_scores [N, M], object_score_logits [N, 1],
      object_pointer [N, C].
    """

    def __init__(self, model):
        super().__init__(model)
        self.multimask = self.trk._use_multimask(False, None)

    def forward(self, tracker_feat_s0, tracker_feat_s1, tracker_feat, memory_pool, memory_index, memory_slot,
                memory_valid, pointer_pool, pointer_index, pointer_offset, pointer_valid):
        pix_feat = self.condition(tracker_feat, memory_pool, memory_index, memory_slot, memory_valid, pointer_pool,
                                  pointer_index, pointer_offset, pointer_valid)
        n = pix_feat.shape[0]
        high_res = [tracker_feat_s0.expand(n, -1, -1, -1), tracker_feat_s1.expand(n, -1, -1, -1)]
        return sam_head(self.trk, pix_feat, high_res, self.multimask)


# -------------------------------------------------------------------------------------- interactive
class InteractiveDecoder(MemoryConditioning):
    """Clicks and boxes: the tracker's prompt path for N objects in one call, as
    ``Sam3TrackerVideoModel._run_single_frame_inference`` runs it with point_inputs and no mask_inputs.

    Inputs: the tracker head, memory and pointer pools exactly as PropagationDecoder, and per object
      use_memory [N] float32: 1 = memory-conditioned features (a click on a frame the object was tracked
        on, is_init_cond_frame=False); 0 = an initial conditioning frame: the current features plus
        no_memory_embedding, the memory inputs ignored (they may be all padding).
      point_coords [N, P, 2] float32: (x, y) in model-input pixels; point_labels [N, P] int32: 1 positive,
        0 negative, 2 / 3 box corners. No pad point: the prompt encoder appends its own. Every row has
        P real points (the runtime groups objects by point count).
      multimask [N] float32: 1 = multimask output and the mask (and token) of the best predicted IoU;
        0 = single-mask output (token 0, the decoder's dynamic_multimask_via_stability applied).
    Outputs as PropagationDecoder: low_res_masks [N, 1, L, L] (NO_OBJ_SCORE where the object score is
      <= 0), iou_scores [N, M] with M = num_multimask_outputs (multimask rows: the M predictions;
      single-mask rows: the one prediction in every column, so max over the row is always the
      returned mask's), object_score_logits [N, 1], object_pointer [N, C].
    Both decoder variants run for every row and each row takes its own (interactive calls are rare).
    """

    def forward(self, tracker_feat_s0, tracker_feat_s1, tracker_feat, memory_pool, memory_index, memory_slot,
                memory_valid, pointer_pool, pointer_index, pointer_offset, pointer_valid, use_memory,
                point_coords, point_labels, multimask):
        n = memory_index.shape[0]
        with_memory = use_memory > 0.5  # [N]
        # A row without memory may have nothing but padding; one "valid" key keeps its (unused) softmax
        # finite, so no NaN exists anywhere in the graph, whatever a backend does with unselected values.
        first = torch.where(with_memory, memory_valid[:, 0], torch.ones_like(memory_valid[:, 0]))
        memory_valid = torch.cat([first[:, None], memory_valid[:, 1:]], dim=1)
        conditioned = self.condition(tracker_feat, memory_pool, memory_index, memory_slot, memory_valid,
                                     pointer_pool, pointer_index, pointer_offset, pointer_valid)
        fresh = (tracker_feat + self.trk.no_memory_embedding.reshape(1, -1, 1, 1)).expand(n, -1, -1, -1)
        pix_feat = torch.where(with_memory[:, None, None, None], conditioned, fresh)

        high_res = [tracker_feat_s0.expand(n, -1, -1, -1), tracker_feat_s1.expand(n, -1, -1, -1)]
        points, labels = point_coords[:, None], point_labels[:, None]
        multi = sam_decode(self.trk, pix_feat, high_res, points, labels, True)
        single = sam_decode(self.trk, pix_feat, high_res, points, labels, False)
        best_mask, best_token = best_of(*multi[:3])
        pick = (multimask > 0.5)[:, None]  # [N, 1]
        low_res = torch.where(pick[:, :, None, None], best_mask, single[0][:, :1])
        token = torch.where(pick, best_token, single[2][:, 0])
        iou = torch.where(pick, multi[1], single[1][:, :1].expand_as(multi[1]))
        scores = torch.where(pick, multi[3], single[3])  # the same value: the object token ignores the mode
        return low_res, iou, scores, object_pointer(self.trk, token, scores)


# ------------------------------------------------------------------------------------------- memory
class MemoryEncoder(nn.Module):
    """Current tracker features + N mask logits -> N spatial memories [N, HW, Cm].

    mask_logits [N, 1, L, L] are low-resolution logits. Per object (float flags, 1 = true):
    - binarize: logits upsampled to the image size, then to the memory size, thresholded at 0 (objects
      re-encoded on a frame that adds objects, or whose mask came from clicks: is_mask_from_pts);
    - else via_image: sigmoid of the logits upsampled to the image size, then to the memory size
      (``_encode_new_memory`` fed with the tracker's high_res_masks, as for objects the tracker itself
      ran on a frame);
    - else: sigmoid of the logits resized straight to the memory size (memory of a tracked frame in
      Sam3VideoModel's planning phase).
    object_score_logits [N, 1] > 0 marks the object as visible. The result is rounded to bfloat16, as
    the reference stores it.
    """

    def __init__(self, model):
        super().__init__()
        trk = model.tracker_model
        self.trk = trk
        self.image_size = trk.image_size
        mh, mw = trk.prompt_encoder.mask_input_size
        self.memory_mask_size = (4 * mh, 4 * mw)

    def forward(self, tracker_feat, mask_logits, object_score_logits, binarize, via_image):
        trk = self.trk
        mask_for_mem = self.mask_for_memory(mask_logits, binarize, via_image)
        mask_for_mem = mask_for_mem * trk.config.sigmoid_scale_for_mem_enc + trk.config.sigmoid_bias_for_mem_enc
        # Sam3TrackerVideoMemoryEncoder.forward, except that the frame's feature projection, the same for
        # every object, runs once and is tiled, not run on a copy per object. Tiled, not broadcast: OpenVINO's
        # CPU plugin fuses a broadcasting add (or one after an Expand, which it removes) into the [1, ...]
        # convolution as an in-place sum and fails for two or more objects ("Can not clone with new dims",
        # openvino 2026.4.1; graphs/sam31/tracker_parts.py had the same fault). torch exports repeat as a
        # no-op Expand and a Tile.
        enc = trk.memory_encoder
        n = mask_for_mem.shape[0]
        features = enc.feature_projection(tracker_feat).repeat(n, 1, 1, 1) + enc.mask_downsampler(mask_for_mem)
        features = enc.projection(enc.memory_fuser(features))
        if trk.occlusion_spatial_embedding_parameter is not None:
            absent = (object_score_logits <= 0).to(features.dtype)[..., None, None]  # [N, 1, 1, 1]
            features = features + absent * trk.occlusion_spatial_embedding_parameter[..., None, None]
        features = round_to_bfloat16(features)
        return features.flatten(2).transpose(1, 2)

    def mask_for_memory(self, mask_logits, binarize, via_image):
        """[N, 1, L, L] logits -> [N, 1, M, M] masks, by the rules above, the objects as the channels of one
        image (ops.objects_as_channels: OpenVINO's resize and element-wise kernels vectorise over channels)."""
        planes = objects_as_channels(mask_logits)
        direct = F.interpolate(planes, size=self.memory_mask_size, mode="bilinear", align_corners=False)
        image_res = F.interpolate(planes, size=(self.image_size, self.image_size), mode="bilinear",
                                  align_corners=False)
        # the reference resizes image-size masks with antialias=True: plain bilinear when upsampling
        through_image = resize_antialiased(image_res, self.memory_mask_size)
        hard = (through_image > 0).to(mask_logits.dtype)
        soft = torch.sigmoid(torch.where(via_image[None, :, None, None] > 0.5, through_image, direct))
        return channels_as_objects(torch.where(binarize[None, :, None, None] > 0.5, hard, soft))


# ---------------------------------------------------------------------------------------- mask init
class MaskInit(nn.Module):
    """New objects from binary detection masks [N, 1, L, L] (the reference's `_use_mask_as_output`).

    The mask itself becomes the output (logits -10 / +10); the SAM decoder, prompted with the
    downsampled mask, only supplies the object pointer.
    Outputs low_res_masks [N, 1, L, L], object_pointer [N, C], object_score_logits [N, 1].
    """

    def __init__(self, model):
        super().__init__()
        self.trk = model.tracker_model
        self.image_size = self.trk.image_size
        self.mask_size = tuple(self.trk.prompt_encoder.mask_input_size)
        self.grid = self.trk.backbone_feature_sizes[-1][0]

    def forward(self, tracker_feat, masks):
        trk, n = self.trk, masks.shape[0]
        # the objects as channels through both resizes: OpenVINO vectorises its resize over channels
        image_planes = resize_antialiased(objects_as_channels(masks), (self.image_size, self.image_size))
        low_res = channels_as_objects(resize_antialiased(image_planes * 20.0 - 10.0, self.mask_size))
        mask_prompt = trk.mask_downsample(channels_as_objects(image_planes))
        if tuple(mask_prompt.shape[-2:]) != self.mask_size:
            mask_prompt = resize_antialiased(mask_prompt, self.mask_size)
        # The pointer comes from the decoder's tokens, which never see the high-resolution levels; zeros
        # stand in for them so the graph needs only the last tracker level.
        c = tracker_feat.shape[1]
        s0, s1 = (torch.zeros(n, c // f, h, h) for f, h in ((8, 4 * self.grid), (4, 2 * self.grid)))
        _, _, _, pointer = sam_head(trk, tracker_feat.expand(n, -1, -1, -1), [s0, s1], True, mask_prompt)
        visible = (masks.flatten(1) > 0).any(dim=1, keepdim=True).to(pointer.dtype)  # [N, 1]
        pointer = visible * pointer + (1 - visible) * trk.no_object_pointer
        return low_res, pointer, visible * 20.0 - 10.0
