"""Deterministic seeded SAM 3 video checkpoints: the test model, the (smaller) shipped demo model, and
the benchmark's "mid" model at the real widths.

Every weight of rank >= 2 is redrawn as N(0, 1/fan_in) so activations stay O(1) and scores depend on the
image; the result is an ordinary Hugging Face checkpoint directory the exporter loads like
``facebook/sam3``. Why, and the presets (tiny, demo, mid, small): docs/testing.md, "The seeded SAM 3
models".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

IMAGE_SIZE = 112  # a multiple of the 14 px patch: an 8 x 8 token grid
PATCH = 14
SCORE_GAIN = 12.0  # changing the demo preset's weights? regenerate sam3track/demo_bundle (see demo.py)
PRESENCE_LOGIT = 4.0
# Words the tiny BPE merges whole, so common prompts are a few tokens like with the real CLIP vocab.
_WORDS = (
    "person people man woman child dog cat bird horse car bike bicycle motorbike bus truck boat ball "
    "red blue green white black yellow shirt hat tree road wheel rider cyclist phone face hand"
).split()




@dataclass(frozen=True)
class TinyPreset:
    """Widths and depths of a small model; the rest of the config is the same for every preset."""

    name: str
    hidden: int  # FPN / DETR / tracker width
    feed_forward: int  # DETR, tracker mask decoder and memory attention MLP width
    vit_hidden: int
    vit_layers: int  # the last layer is the global-attention one
    text_hidden: int
    text_layers: int
    detr_layers: int  # encoder and decoder each
    memory_attention_layers: int
    # Bias of the tracker's "object present" logit, or None to keep the random draw. At the demo's width
    # the random draw says "absent" for every tracked object, so each object vanished one frame after
    # its birth and the detector made a new one; a trained tracker is confident while the object is seen.
    tracker_object_logit: float | None = None
    # Gain on the detector's query projection (see _rescale_weights), or None for SCORE_GAIN.
    score_gain: float | None = None


TINY = TinyPreset("tiny", hidden=128, feed_forward=256, vit_hidden=64, vit_layers=2, text_hidden=64,
                  text_layers=2, detr_layers=2, memory_attention_layers=2)
DEMO = TinyPreset("demo", hidden=64, feed_forward=128, vit_hidden=32, vit_layers=2, text_hidden=32,
                  text_layers=1, detr_layers=1, memory_attention_layers=1, tracker_object_logit=2.0)
# Widths of the mid preset are not used (it keeps the default config's); depths are.
MID = TinyPreset("mid", hidden=256, feed_forward=2048, vit_hidden=1024, vit_layers=4, text_hidden=1024,
                 text_layers=2, detr_layers=6, memory_attention_layers=4)
# SAM 3 at the sizes of the seeded SAM 3.1 checkpoint the SAM 3.1 reference harness builds
# (reference/sam31/shim.py SMALL: image 224, ViT 256 wide / 2 deep, text 256 wide / 2 layers, DETR
# 2 + 2 layers; every tracker width, head count and memory setting the real model's), so the SAM 3 and
# SAM 3.1 paths can be measured on the same small config (benchmarks, issue 12).
# Its score gain is 1: at SCORE_GAIN every query's class logit saturated and all 200 first-frame scores
# tied at the presence probability (0.99152), so no threshold could choose N objects.
SMALL = TinyPreset("small", hidden=256, feed_forward=2048, vit_hidden=256, vit_layers=2, text_hidden=256,
                   text_layers=2, detr_layers=2, memory_attention_layers=4, score_gain=1.0)
PRESETS = {p.name: p for p in (TINY, DEMO, MID, SMALL)}
MID_IMAGE_SIZE = 504  # 36 x 36 tokens; window 18 tiles it as the real model's 24 tiles 72
MID_WINDOW = 18
SMALL_IMAGE_SIZE = 224  # 16 x 16 tokens, as the SAM 3.1 small config
SMALL_VIT = dict(heads=4, mlp=1184, window=24, pretrain_grid=24)  # the SAM 3.1 small ViT's (mlp = 4.625 x width)


def mid_config(preset: TinyPreset = MID):
    """The default (real) SAM 3 video config at 504 px with a 4-layer ViT and a 2-layer text encoder
    (``preset`` SMALL: at 224 px with the SAM 3.1 small config's ViT, text encoder and DETR depths)."""
    from transformers import Sam3VideoConfig

    cfg = Sam3VideoConfig()
    det, trk = cfg.detector_config, cfg.tracker_config
    side = image_size(preset)
    grid = side // PATCH
    sizes = [[4 * grid, 4 * grid], [2 * grid, 2 * grid], [grid, grid]]
    vit = det.vision_config.backbone_config
    vit.num_hidden_layers, vit.global_attn_indexes = preset.vit_layers, [preset.vit_layers - 1]
    vit.window_size = MID_WINDOW
    if preset is SMALL:
        vit.hidden_size, vit.num_attention_heads = preset.vit_hidden, SMALL_VIT["heads"]
        vit.intermediate_size, vit.window_size = SMALL_VIT["mlp"], SMALL_VIT["window"]
        vit.pretrain_image_size = SMALL_VIT["pretrain_grid"] * PATCH
        txt = det.text_config
        txt.hidden_size, txt.intermediate_size = preset.text_hidden, 4 * preset.text_hidden
        txt.num_attention_heads = preset.text_hidden // 64
        det.detr_encoder_config.num_layers = det.detr_decoder_config.num_layers = preset.detr_layers
    for vision in (det.vision_config, trk.vision_config):
        vision.backbone_feature_sizes = sizes
    det.text_config.num_hidden_layers = preset.text_layers
    trk.memory_attention_rope_feat_sizes = [grid, grid]
    cfg.image_size = side
    trk.prompt_encoder_config.image_size = side
    cfg.low_res_mask_size = 4 * grid
    # Thresholds as the tiny model's (random weights score lower than trained ones); the benchmark sets
    # its own on both sides to control the object count.
    cfg.score_threshold_detection = 0.2
    cfg.new_det_thresh = 0.5
    return cfg


def image_size(preset: TinyPreset) -> int:
    return {"mid": MID_IMAGE_SIZE, "small": SMALL_IMAGE_SIZE}.get(preset.name, IMAGE_SIZE)


def tiny_config(preset: TinyPreset = TINY):
    from transformers import Sam3VideoConfig

    if preset in (MID, SMALL):
        return mid_config(preset)

    hidden, ffn = preset.hidden, preset.feed_forward
    grid = IMAGE_SIZE // PATCH
    sizes = [[4 * grid, 4 * grid], [2 * grid, 2 * grid], [grid, grid]]
    cfg = Sam3VideoConfig()
    det, trk = cfg.detector_config, cfg.tracker_config

    vit = det.vision_config.backbone_config
    vit.hidden_size, vit.intermediate_size = preset.vit_hidden, 2 * preset.vit_hidden
    vit.num_hidden_layers, vit.num_attention_heads = preset.vit_layers, 2
    vit.window_size, vit.global_attn_indexes, vit.pretrain_image_size = 4, [preset.vit_layers - 1], IMAGE_SIZE
    for vision in (det.vision_config, trk.vision_config):
        vision.fpn_hidden_size = hidden
        vision.backbone_feature_sizes = sizes

    txt = det.text_config
    txt.hidden_size, txt.intermediate_size = preset.text_hidden, 2 * preset.text_hidden
    txt.num_hidden_layers, txt.num_attention_heads = preset.text_layers, 2
    txt.projection_dim = preset.text_hidden

    for sub in (det.geometry_encoder_config, det.detr_encoder_config, det.detr_decoder_config):
        sub.hidden_size, sub.num_attention_heads, sub.intermediate_size = hidden, 4, ffn
    det.geometry_encoder_config.num_layers = 1
    det.detr_encoder_config.num_layers = preset.detr_layers
    det.detr_decoder_config.num_layers = preset.detr_layers
    det.detr_decoder_config.num_queries = 16
    det.mask_decoder_config.hidden_size, det.mask_decoder_config.num_attention_heads = hidden, 4

    trk.prompt_encoder_config.hidden_size = hidden
    md = trk.mask_decoder_config
    md.hidden_size, md.mlp_dim, md.num_attention_heads, md.iou_head_hidden_dim = hidden, ffn, 4, hidden
    trk.memory_attention_hidden_size = hidden
    trk.memory_attention_num_layers = preset.memory_attention_layers
    trk.memory_attention_feed_forward_hidden_size = ffn
    trk.memory_attention_rope_feat_sizes = [grid, grid]
    trk.memory_encoder_hidden_size = hidden
    trk.mask_downsampler_embed_dim = hidden
    trk.memory_fuser_embed_dim = hidden
    trk.memory_fuser_intermediate_dim = ffn
    # memory_encoder_output_channels stays 64: the cross-attention's kv_in_dim is hard-coded to 64.

    cfg.image_size = IMAGE_SIZE  # propagates to detector, tracker and prompt encoder
    trk.prompt_encoder_config.image_size = IMAGE_SIZE
    cfg.low_res_mask_size = 4 * grid
    # Random weights score lower than a trained model: lower thresholds so objects are born, tracked and
    # removed on the sample clips. They travel in config.json, so the reference uses them too.
    cfg.score_threshold_detection = 0.2
    cfg.new_det_thresh = 0.5
    # Hole filling works on the low-resolution masks: 16 px of a 288 x 288 mask is ~0.2 px of 32 x 32.
    cfg.fill_hole_area = 1
    return cfg


def tiny_tokenizer(vocab_size_hint: int | None = None):
    """A CLIP-style byte-level BPE tokenizer with a small vocabulary (built offline, no hub)."""
    from transformers import CLIPTokenizer
    from tokenizers.pre_tokenizers import ByteLevel

    symbols = ByteLevel.alphabet()
    symbols.sort()
    vocab: dict[str, int] = {}
    for s in symbols + [s + "</w>" for s in symbols]:
        vocab.setdefault(s, len(vocab))
    merges: list[tuple[str, str]] = []
    for word in _WORDS:  # left-to-right merges that build each word as a single "word</w>" token
        pieces = list(word[:-1]) + [word[-1] + "</w>"]
        while len(pieces) > 1:
            a, b = pieces[0], pieces[1]
            if (a, b) not in merges:
                merges.append((a, b))
            vocab.setdefault(a + b, len(vocab))
            pieces = [a + b] + pieces[2:]
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab.setdefault(special, len(vocab))
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=32)


@torch.no_grad()
def _rescale_weights(model: torch.nn.Module, seed: int, preset: TinyPreset) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        if param.dim() >= 2:
            fan_in = param[0].numel()
            param.copy_(torch.randn(param.shape, generator=gen) / fan_in**0.5)
        elif name.endswith("bias"):
            param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    # Spread detection logits (query x text dot products) so scores cross the thresholds depending on
    # the image, and make the presence head confident, as a trained model is on frames with the concept.
    scoring = model.detector_model.dot_product_scoring
    scoring.query_proj.weight.mul_(SCORE_GAIN if preset.score_gain is None else preset.score_gain)
    model.detector_model.detr_decoder.presence_head.layer3.bias.fill_(PRESENCE_LOGIT)
    if preset.tracker_object_logit is not None:
        model.tracker_model.mask_decoder.pred_obj_score_head.proj_out.bias.fill_(preset.tracker_object_logit)


def write_tiny_checkpoint(out_dir: Path, seed: int = 0, preset: TinyPreset = TINY) -> Path:
    """Save the small seeded model of ``preset`` as a Hugging Face checkpoint directory and return it."""
    from transformers import Sam3VideoModel

    tokenizer = tiny_tokenizer()
    cfg = tiny_config(preset)
    cfg.detector_config.text_config.vocab_size = len(tokenizer)
    cfg.detector_config.text_config.eos_token_id = tokenizer.eos_token_id
    cfg.detector_config.text_config.bos_token_id = tokenizer.bos_token_id
    cfg.detector_config.text_config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = Sam3VideoModel(cfg).eval()
    _rescale_weights(model, seed, preset)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    # The same fields a real snapshot's preprocessor_config.json carries for the image side.
    (out_dir / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Sam3ImageProcessorFast",
                "do_resize": True,
                "size": {"height": image_size(preset), "width": image_size(preset)},
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "resample": 2,
            },
            indent=2,
        )
    )
    return out_dir
