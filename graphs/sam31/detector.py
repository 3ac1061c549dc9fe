"""SAM 3.1's detector-side graphs: thin torch wrappers around transformers' SAM 3 modules, and their specs.

``backbone``, ``interactive_neck``, ``text_encoder``, ``grounding_head`` and ``box_grounding_head``, with
boundaries from Meta's per-frame flow (sam3_multiplex_base.py ``run_backbone_and_detection``). The
backbone and the interactive neck take a per-image ``round_levels`` flag (1: tracker levels rounded to
bfloat16, as Meta's add_prompt; 0: float32, as its propagation). Each graph's role and why the rounding:
docs/sam31.md, "The detector-side graphs".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..ops import round_to_bfloat16
from ..spec_types import GraphSpec, TensorSpec


class Sam31DetectorModel(nn.Module):
    """The detector half of SAM 3.1 on transformers modules. ``detector``: Sam3Model (ViT, the ``convs``
    neck as vision_encoder.neck, text encoder, geometry encoder, DETR, scoring, segmentation head);
    ``propagation_neck`` / ``interactive_neck``: the other two necks; ``*_conv_s0`` / ``*_conv_s1``: the
    high-resolution convs of the propagation (multiplex) and interactive SAM decoders."""

    def __init__(self, detector, propagation_neck, interactive_neck, sizes):
        super().__init__()
        self.detector = detector
        self.propagation_neck = propagation_neck
        self.interactive_neck = interactive_neck
        c = sizes.fpn_width
        self.propagation_conv_s0 = nn.Conv2d(c, sizes.conv_s0_channels, 1)
        self.propagation_conv_s1 = nn.Conv2d(c, sizes.conv_s1_channels, 1)
        self.interactive_conv_s0 = nn.Conv2d(c, sizes.conv_s0_channels, 1)
        self.interactive_conv_s1 = nn.Conv2d(c, sizes.conv_s1_channels, 1)
        self.sizes = sizes


def _rounded(levels, round_levels):
    """Each image's levels rounded to bfloat16 where its flag is 1 (Meta's single-frame path)."""
    pick = (round_levels > 0.5)[:, None, None, None]
    return [torch.where(pick, round_to_bfloat16(x), x) for x in levels]


def _tracker_head(neck, conv_s0, conv_s1, trunk, round_levels):
    levels = _rounded([layer(trunk) for layer in neck.fpn_layers], round_levels)
    return conv_s0(levels[0]), conv_s1(levels[1]), levels[2]


class Backbone(nn.Module):
    """pixel_values [I, 3, S, S], round_levels [I] -> detector_fpn0..2, tracker_feat_s0 / _s1 / tracker_feat,
    trunk_features [I, Cv, F, F]."""

    def __init__(self, model: Sam31DetectorModel):
        super().__init__()
        self.trunk = model.detector.vision_encoder.backbone
        self.patch = model.sizes.patch_size
        self.detector_neck = model.detector.vision_encoder.neck
        self.neck = model.propagation_neck
        self.conv_s0, self.conv_s1 = model.propagation_conv_s0, model.propagation_conv_s1

    def forward(self, pixel_values, round_levels):
        hidden = self.trunk(pixel_values).last_hidden_state
        h, w = pixel_values.shape[-2] // self.patch, pixel_values.shape[-1] // self.patch
        trunk = hidden.view(hidden.shape[0], h, w, -1).permute(0, 3, 1, 2)
        detector = [layer(trunk) for layer in self.detector_neck.fpn_layers]
        tracker = _tracker_head(self.neck, self.conv_s0, self.conv_s1, trunk, round_levels)
        return (*detector, *tracker, trunk)


class InteractiveNeck(nn.Module):
    """trunk_features [I, Cv, F, F], round_levels [I] -> interactive_feat_s0 / _s1 / interactive_feat."""

    def __init__(self, model: Sam31DetectorModel):
        super().__init__()
        self.neck = model.interactive_neck
        self.conv_s0, self.conv_s1 = model.interactive_conv_s0, model.interactive_conv_s1

    def forward(self, trunk_features, round_levels):
        return _tracker_head(self.neck, self.conv_s0, self.conv_s1, trunk_features, round_levels)


class TextEncoder(nn.Module):
    """input_ids [M, T] -> text_features [M, T, D], text_mask [M, T] (1 = token, 0 = padding).

    Meta's text transformer is causal with no padding mask, so every position, padding included, is
    what Meta computes (transformers masks padding inside CLIP, which changes only the padding rows).
    Meta's mask is ``ids != 0`` (the pad id), so a prompt holding "!" (id 0 too) loses that token; the
    mask comes from here so the runtime cannot apply another rule."""

    def __init__(self, model: Sam31DetectorModel):
        super().__init__()
        self.text = model.detector.text_encoder
        self.projection = model.detector.text_projection

    def forward(self, input_ids):
        hidden = self.text(input_ids=input_ids.long(), attention_mask=None).last_hidden_state
        return self.projection(hidden), (input_ids != 0).to(torch.int32)


def _geometry_cls_token(geo, vision, vision_pos):
    """Meta's geometry encoder on a text-only prompt (sam3_image.py ``_encode_prompt``): no points or
    boxes, so its output is the CLS token alone, after the encoder layers' cross-attention to the image.
    vision, vision_pos [B, C, H, W] -> [B, 1, C]."""
    b, c = vision.shape[0], vision.shape[1]
    token = geo.prompt_layer_norm(geo.final_proj(geo.cls_embed.weight.reshape(1, 1, c).expand(b, 1, c)))
    feats, pos = vision.flatten(2).transpose(1, 2), vision_pos.flatten(2).transpose(1, 2)
    for layer in geo.layers:
        token = layer(prompt_feats=token, vision_feats=feats, vision_pos_encoding=pos, prompt_mask=None)
    return geo.output_layer_norm(token)


def joint_logits(class_logits, presence_logits):
    """Meta's detection logit (sam3_image.py): inverse_sigmoid(sigmoid(cls) * sigmoid(presence)), with
    inverse_sigmoid's eps of 1e-3, clamped to +-10. The eps bounds it to +-6.9 (probabilities 0.001..0.999),
    which the detection scores Meta reports carry."""
    from transformers.models.sam3.modeling_sam3 import inverse_sigmoid

    joint = class_logits.sigmoid() * presence_logits.sigmoid()
    return inverse_sigmoid(joint).clamp(min=-10.0, max=10.0)


class GroundingHead(nn.Module):
    """detector_fpn0..2 [I, C, *] + text_features [P, T, D], text_mask [P, T] (P = 1 or I: row i is image
    i with prompt i, or every image with the one prompt) -> per image pred_logits [I, Q] (Meta's joint
    logits), presence_logits [I, 1], pred_boxes [I, Q, 4] (xyxy, normalised), pred_masks [I, Q, L, L]."""

    def __init__(self, model: Sam31DetectorModel):
        super().__init__()
        self.detector = model.detector
        neck = self.detector.vision_encoder.neck
        c = model.sizes.fpn_width
        sizes = [(4 * model.sizes.grid,) * 2, (2 * model.sizes.grid,) * 2, (model.sizes.grid,) * 2]
        # constants of the feature sizes: folded into the graph rather than passed every frame
        self.pos = [neck.position_encoding((1, c, h, w), "cpu", torch.float32) for h, w in sizes]

    def forward(self, detector_fpn0, detector_fpn1, detector_fpn2, text_features, text_mask):
        levels, pos = self._levels(detector_fpn0, detector_fpn1, detector_fpn2)
        images = levels[0].shape[0]
        cls = _geometry_cls_token(self.detector.geometry_encoder, levels[-1], pos[-1])
        text = text_features.expand(images, -1, -1)
        prompt = torch.cat([text, cls], dim=1)  # 32 text tokens + the CLS token: Meta's 33-token prompt
        mask = torch.cat([text_mask.expand(images, -1) > 0, torch.ones_like(text_mask[:1, :1]).expand(images, 1) > 0],
                         dim=1)
        return self._detect(levels, pos, prompt, mask)

    def _levels(self, *levels):
        return list(levels), [p.expand(levels[0].shape[0], -1, -1, -1) for p in self.pos]

    def _detect(self, levels, pos, prompt, mask):
        """Meta's forward_grounding after _encode_prompt: DETR encoder and decoder, box head, dot-product
        scoring and segmentation head on the prompt tokens [I, N, D] (mask [I, N], True = a token)."""
        det = self.detector
        encoded = det.detr_encoder(vision_features=[levels[-1]], text_features=prompt,
                                   vision_pos_embeds=[pos[-1]], text_mask=mask)
        decoded = det.detr_decoder(vision_features=encoded.last_hidden_state, text_features=encoded.text_features,
                                   vision_pos_encoding=encoded.pos_embeds_flattened, text_mask=mask,
                                   spatial_shapes=encoded.spatial_shapes)
        from transformers.models.sam3.modeling_sam3 import box_cxcywh_to_xyxy, inverse_sigmoid

        hidden = decoded.intermediate_hidden_states[-1:]
        offsets = det.detr_decoder.box_head(hidden)
        boxes = box_cxcywh_to_xyxy((inverse_sigmoid(decoded.reference_boxes[-1:]) + offsets).sigmoid())[-1]
        class_logits = det.dot_product_scoring(decoder_hidden_states=hidden, text_features=encoded.text_features,
                                               text_mask=mask).squeeze(-1)[-1]
        presence = decoded.presence_logits[-1]
        masks = det.mask_decoder(decoder_queries=hidden[-1], backbone_features=levels,
                                 encoder_hidden_states=encoded.last_hidden_state, prompt_features=prompt,
                                 prompt_mask=mask).pred_masks
        return joint_logits(class_logits, presence), presence, boxes, masks


def _box_tokens(geo, vision, vision_pos, boxes, box_labels, box_valid):
    """Meta's geometry encoder on box prompts (geometry_encoders.py ``SequenceGeometryEncoder``: each box
    direct-projected + ROI-pooled + position-encoded + label-embedded, then the CLS token, the projection and
    the encoder layers; transformers' Sam3GeometryEncoder holds the same weights). boxes [B, K, 4] normalised
    cxcywh, box_labels [B, K] (1 positive, 0 negative), box_valid [B, K] (1 = a box, 0 = padding) ->
    tokens [B, K + 1, C], mask [B, K + 1] (True = a token). Meta packs the CLS token right after an image's
    real boxes; here it is last: the prompt's attention and pooling do not depend on token order."""
    from transformers.models.sam3.modeling_sam3 import box_cxcywh_to_xyxy

    from .roi_align import roi_align

    b, c, h, w = vision.shape
    k = boxes.shape[1]
    normed = geo.vision_layer_norm(vision.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    embed = geo.boxes_direct_project(boxes)
    scale = torch.tensor([w, h, w, h], dtype=torch.float32).view(1, 1, 4)
    rois = (box_cxcywh_to_xyxy(boxes) * scale).reshape(-1, 4)
    # each box's image, as a cumulative count so that the graph keeps B and K dynamic
    batch_index = (torch.ones_like(box_labels[:, :1]).long().cumsum(0) - 1 + 0 * box_labels.long()).reshape(-1)
    pooled = geo.boxes_pool_project(roi_align(normed, rois, batch_index, geo.roi_size))
    embed = embed + pooled.view(b, k, c)
    cx, cy, bw, bh = boxes.unbind(-1)
    coords = geo._encode_box_coordinates(cx.flatten(), cy.flatten(), bw.flatten(), bh.flatten())
    embed = embed + geo.boxes_pos_enc_project(coords.view(b, k, -1))
    embed = geo.label_embed(box_labels.long()) + embed
    tokens = torch.cat([embed, geo.cls_embed.weight.reshape(1, 1, c).expand(b, 1, c)], dim=1)
    tokens = geo.prompt_layer_norm(geo.final_proj(tokens))
    mask = torch.cat([box_valid > 0, torch.ones_like(box_valid[:, :1]) > 0], dim=1)
    # padded boxes are keys no token attends to (eager attention adds this to its scores)
    bias = torch.where(mask, 0.0, torch.finfo(torch.float32).min)[:, None, None, :]
    feats, pos = vision.flatten(2).transpose(1, 2), vision_pos.flatten(2).transpose(1, 2)
    for layer in geo.layers:
        tokens = layer(prompt_feats=tokens, vision_feats=feats, vision_pos_encoding=pos, prompt_mask=bias)
    return geo.output_layer_norm(tokens), mask


class BoxGroundingHead(GroundingHead):
    """The grounding head with box prompts, for the frame of a boxes add_prompt (Meta encodes the boxes
    there only): GroundingHead's inputs plus boxes [I, K, 4] (normalised cxcywh), box_labels [I, K] int32 (1
    positive, 0 negative) and box_valid [I, K] int32 (0 = padding, so a call can be padded to a gear). The
    prompt is the text tokens, then the box tokens and the CLS token, as Meta's _encode_prompt concatenates
    them."""

    def forward(self, detector_fpn0, detector_fpn1, detector_fpn2, text_features, text_mask, boxes, box_labels,
                box_valid):
        levels, pos = self._levels(detector_fpn0, detector_fpn1, detector_fpn2)
        images = levels[0].shape[0]
        geo, geo_mask = _box_tokens(self.detector.geometry_encoder, levels[-1], pos[-1], boxes, box_labels, box_valid)
        prompt = torch.cat([text_features.expand(images, -1, -1), geo], dim=1)
        mask = torch.cat([text_mask.expand(images, -1) > 0, geo_mask], dim=1)
        return self._detect(levels, pos, prompt, mask)


# --------------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class Dims:
    """Concrete sizes of the graphs, from the checkpoint's Sam31Sizes."""

    image_size: int
    grid: int
    trunk_width: int
    fpn_width: int
    conv_s0_channels: int
    conv_s1_channels: int
    text_length: int
    text_width: int
    num_queries: int
    mask_size: int
    vocab_size: int

    @classmethod
    def from_sizes(cls, s) -> "Dims":
        return cls(image_size=s.image_size, grid=s.grid, trunk_width=s.vit_width, fpn_width=s.fpn_width,
                   conv_s0_channels=s.conv_s0_channels, conv_s1_channels=s.conv_s1_channels,
                   text_length=s.text_context, text_width=s.d_model, num_queries=s.num_queries,
                   mask_size=s.mask_size, vocab_size=s.vocab_size)


GRAPHS = ("text_encoder", "backbone", "interactive_neck", "grounding_head", "box_grounding_head")


def graph_specs(d: Dims) -> dict[str, GraphSpec]:
    g, c = d.grid, d.fpn_width

    def levels(prefix):
        return (TensorSpec(f"{prefix}_s0", "float32", ("images", d.conv_s0_channels, 4 * g, 4 * g)),
                TensorSpec(f"{prefix}_s1", "float32", ("images", d.conv_s1_channels, 2 * g, 2 * g)),
                TensorSpec(prefix, "float32", ("images", c, g, g)))

    detector = tuple(TensorSpec(f"detector_fpn{i}", "float32", ("images", c, (4 >> i) * g, (4 >> i) * g))
                     for i in range(3))
    trunk = TensorSpec("trunk_features", "float32", ("images", d.trunk_width, g, g))
    round_levels = TensorSpec("round_levels", "float32", ("images",))
    q, t = d.num_queries, d.text_length
    specs = {
        "text_encoder": GraphSpec(
            "text_encoder", TextEncoder,
            inputs=(TensorSpec("input_ids", "int32", ("prompts", t)),),
            outputs=(TensorSpec("text_features", "float32", ("prompts", t, d.text_width)),
                     TensorSpec("text_mask", "int32", ("prompts", t))),
        ),
        "backbone": GraphSpec(
            "backbone", Backbone,
            inputs=(TensorSpec("pixel_values", "float32", ("images", 3, d.image_size, d.image_size)), round_levels),
            outputs=detector + levels("tracker_feat") + (trunk,),
        ),
        "interactive_neck": GraphSpec(
            "interactive_neck", InteractiveNeck, inputs=(trunk, round_levels), outputs=levels("interactive_feat"),
        ),
        "grounding_head": GraphSpec(
            "grounding_head", GroundingHead,
            inputs=detector + (TensorSpec("text_features", "float32", ("prompts", t, d.text_width)),
                               TensorSpec("text_mask", "int32", ("prompts", t))),
            outputs=(TensorSpec("pred_logits", "float32", ("images", q)),
                     TensorSpec("presence_logits", "float32", ("images", 1)),
                     TensorSpec("pred_boxes", "float32", ("images", q, 4)),
                     TensorSpec("pred_masks", "float32", ("images", q, d.mask_size, d.mask_size))),
        ),
    }
    specs["box_grounding_head"] = GraphSpec(
        "box_grounding_head", BoxGroundingHead,
        inputs=specs["grounding_head"].inputs + (TensorSpec("boxes", "float32", ("images", "boxes", 4)),
                                                 TensorSpec("box_labels", "int32", ("images", "boxes")),
                                                 TensorSpec("box_valid", "int32", ("images", "boxes"))),
        outputs=specs["grounding_head"].outputs,
    )
    return specs


def sample_inputs(spec: GraphSpec, d: Dims, sizes: dict[str, int], seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded inputs of the right dtypes; for the grounding head "prompts" equals "images" unless given."""
    gen = torch.Generator().manual_seed(seed)
    sizes = dict(sizes)
    sizes.setdefault("prompts", sizes.get("images", 1))
    out = {}
    for t in spec.inputs:
        shape = tuple(sizes[x] if isinstance(x, str) else x for x in t.shape)
        if t.name == "input_ids":
            lengths = torch.randint(3, d.text_length + 1, (shape[0],), generator=gen)
            ids = torch.randint(1, d.vocab_size - 2, shape, generator=gen)
            ids[:, 0] = d.vocab_size - 2  # start of text
            ids[torch.arange(shape[0]), lengths - 1] = d.vocab_size - 1  # end of text
            out[t.name] = torch.where(torch.arange(shape[1])[None] < lengths[:, None], ids, 0).to(torch.int32)
        elif t.name == "text_mask":
            lengths = torch.randint(2, d.text_length + 1, (shape[0],), generator=gen)
            out[t.name] = (torch.arange(d.text_length)[None] < lengths[:, None]).to(torch.int32)
        elif t.name == "round_levels":
            out[t.name] = (torch.arange(shape[0]) % 2 == 0).float()
        elif t.name == "boxes":  # normalised cxcywh inside the image, some reaching its edges
            center, size = torch.rand(shape[:2] + (2,), generator=gen), torch.rand(shape[:2] + (2,), generator=gen)
            size = size * torch.minimum(center, 1 - center) * 2
            out[t.name] = torch.cat([center, size.clamp(min=1e-3)], -1)
        elif t.name == "box_labels":
            out[t.name] = torch.randint(0, 2, shape, generator=gen).to(torch.int32)
        elif t.name == "box_valid":  # the last box of every other image is padding
            valid = torch.ones(shape, dtype=torch.int32)
            valid[1::2, -1] = 0 if shape[1] > 1 else 1
            out[t.name] = valid
        elif t.name == "pixel_values":
            out[t.name] = torch.rand(shape, generator=gen) * 2 - 1
        else:
            out[t.name] = torch.randn(shape, generator=gen)
    return out
