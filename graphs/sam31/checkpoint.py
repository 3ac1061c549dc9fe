"""Reading Meta's SAM 3.1 checkpoint (``sam3.1_multiplex.pt``) onto transformers' SAM 3 modules.

The detector half maps onto transformers' ``Sam3Model`` plus two more ``Sam3VisionNeck``s; the tracker
half (TRACKER_PREFIXES) is claimed by the tracker export. Loading is strict: every key is mapped, or in
IGNORED with the reason. File layouts and the mapping: docs/sam31.md, "The checkpoint".
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..onnx_export import CheckpointError

FAMILY = "sam3.1"
CHECKPOINT_FILES = ("sam3.1_multiplex.pt", "sam3.1_multiplex.safetensors")
BPE_FILE = "bpe_simple_vocab_16e6.txt.gz"
SMALL_CONFIG = "small_config.json"
PATCH = 14  # Meta's builder: patch_size=14 (the stride every feature size derives from)
VIT_HEAD_DIM = 64  # 1024 / 16 heads in the full model; the seeded one keeps it (256 / 4)
TEXT_HEAD_DIM = 64
DETR_HEADS = 8  # Meta's builder: every DETR / geometry / segmentation attention has 8 heads
VIT_WINDOW_DEFAULT = 24
FULL_IMAGE_SIZE = 1008
FULL_GLOBAL_BLOCKS = (7, 15, 23, 31)

# Meta's internal prefixes -> the public ones (as build_sam3_multiplex_video_predictor renames them)
INTERNAL_PREFIXES = (("sam3_model.", "detector."), ("sam2_predictor.", "tracker."))

# Checkpoint keys the detector does not need, and why.
IGNORED = (
    (r"detector\.backbone\.vision_backbone\.trunk\.blocks\.\d+\.attn\.freqs_cis(_real|_imag)?",
     "ViT RoPE tables: transformers' Sam3ViTRotaryEmbedding computes the same ones"),
    (r"detector\.geometry_encoder\.points_(direct|pool|pos_enc)_project\.(weight|bias)",
     "the geometry encoder's point path: text prompts send no points to the detector (clicks go to the "
     "tracker's interactive head) and transformers' Sam3GeometryEncoder has none"),
)
# The tracker half: claimed by the tracker export, not by this detector loader.
TRACKER_PREFIXES = tuple(f"tracker.model.{p}" for p in (
    "sam_mask_decoder.", "interactive_sam_mask_decoder.", "interactive_sam_prompt_encoder.",
    "transformer.encoder.", "maskmem_backbone.", "obj_ptr_proj.", "interactive_obj_ptr_proj.",
    "obj_ptr_tpos_proj.", "no_obj_ptr_linear.", "interactive_mask_downsample.", "image_pe_layer.",
    "maskmem_tpos_enc", "interactivity_no_mem_embed", "no_obj_embed_spatial", "output_valid_embed",
    "output_invalid_embed",
))

# --------------------------------------------------------------------------------------- key map
# (Meta key regex, our key template, how the tensor is turned into ours). Our keys are those of
# Sam31DetectorModel: "detector." = transformers' Sam3Model; the other attributes are ours.
#   "copy"        the tensor as is
#   "qkv"         a fused [3C, ...] q/k/v projection split into q_proj / k_proj / v_proj
#   "drop_cls"    the ViT position embedding without its class-token row
#   "transpose"   CLIP's text_projection (Meta stores x @ W, transformers a Linear)
_VIT = r"detector\.backbone\.vision_backbone\.trunk\."
_TXT = r"detector\.backbone\.language_backbone\.encoder\."
_NECK_LAYERS = (("dconv_2x2_0", "scale_layers.0"), ("dconv_2x2_1", "scale_layers.2"),
                ("dconv_2x2", "scale_layers.0"), ("conv_1x1", "proj1"), ("conv_3x3", "proj2"))
_NECKS = (("convs", "detector.vision_encoder.neck"), ("propagation_convs", "propagation_neck"),
          ("interactive_convs", "interactive_neck"))
_P = r"(weight|bias)"


def _attention_rules(meta: str, ours: str, out_name: str = "o_proj"):
    """nn.MultiheadAttention's fused in_proj and out_proj -> q/k/v_proj and o_proj (or CLIP's out_proj)."""
    last = rf"\{re.compile(meta).groups + 1}"  # weight / bias: the group after those of ``meta``
    return [(rf"{meta}\.in_proj_{_P}", rf"{ours}.{{q}}.{last}", "qkv"),
            (rf"{meta}\.out_proj\.{_P}", rf"{ours}.{out_name}.{last}", "copy")]


def _rules():
    r = [
        (_VIT + r"pos_embed", "detector.vision_encoder.backbone.embeddings.position_embeddings", "drop_cls"),
        (_VIT + r"patch_embed\.proj\.weight", "detector.vision_encoder.backbone.embeddings.patch_embeddings."
         "projection.weight", "copy"),
        (_VIT + rf"ln_pre\.{_P}", r"detector.vision_encoder.backbone.layer_norm.\1", "copy"),
        (_VIT + rf"blocks\.(\d+)\.norm([12])\.{_P}", r"detector.vision_encoder.backbone.layers.\1.layer_norm\2.\3", "copy"),
        (_VIT + rf"blocks\.(\d+)\.attn\.qkv\.{_P}", r"detector.vision_encoder.backbone.layers.\1.attention.{q}.\2", "qkv"),
        (_VIT + rf"blocks\.(\d+)\.attn\.proj\.{_P}", r"detector.vision_encoder.backbone.layers.\1.attention.o_proj.\2", "copy"),
        (_VIT + rf"blocks\.(\d+)\.mlp\.fc([12])\.{_P}", r"detector.vision_encoder.backbone.layers.\1.mlp.fc\2.\3", "copy"),
        (_TXT + r"token_embedding\.weight", "detector.text_encoder.text_model.embeddings.token_embedding.weight", "copy"),
        (_TXT + r"positional_embedding", "detector.text_encoder.text_model.embeddings.position_embedding.weight", "copy"),
        (_TXT + rf"ln_final\.{_P}", r"detector.text_encoder.text_model.final_layer_norm.\1", "copy"),
        (_TXT + r"text_projection", "detector.text_encoder.text_projection.weight", "transpose"),
        (_TXT + rf"transformer\.resblocks\.(\d+)\.ln_([12])\.{_P}",
         r"detector.text_encoder.text_model.encoder.layers.\1.layer_norm\2.\3", "copy"),
        (_TXT + rf"transformer\.resblocks\.(\d+)\.mlp\.c_fc\.{_P}", r"detector.text_encoder.text_model.encoder.layers.\1.mlp.fc1.\2", "copy"),
        (_TXT + rf"transformer\.resblocks\.(\d+)\.mlp\.c_proj\.{_P}", r"detector.text_encoder.text_model.encoder.layers.\1.mlp.fc2.\2", "copy"),
        (rf"detector\.backbone\.language_backbone\.resizer\.{_P}", r"detector.text_projection.\1", "copy"),
    ]
    r += _attention_rules(_TXT + r"transformer\.resblocks\.(\d+)\.attn",
                          r"detector.text_encoder.text_model.encoder.layers.\1.self_attn", "out_proj")
    for meta_neck, ours in _NECKS:
        for meta_layer, our_layer in _NECK_LAYERS:
            r.append((rf"detector\.backbone\.vision_backbone\.{meta_neck}\.(\d+)\.{meta_layer}\.{_P}",
                      rf"{ours}.fpn_layers.\1.{our_layer}.\2", "copy"))
    g = r"detector\.geometry_encoder\."
    r += [(g + rf"(label_embed|cls_embed)\.weight", r"detector.geometry_encoder.\1.weight", "copy"),
          (g + rf"(boxes_direct_project|boxes_pool_project|boxes_pos_enc_project|final_proj)\.{_P}",
           r"detector.geometry_encoder.\1.\2", "copy"),
          (g + rf"img_pre_norm\.{_P}", r"detector.geometry_encoder.vision_layer_norm.\1", "copy"),
          (g + rf"norm\.{_P}", r"detector.geometry_encoder.prompt_layer_norm.\1", "copy"),
          (g + rf"encode_norm\.{_P}", r"detector.geometry_encoder.output_layer_norm.\1", "copy"),
          (g + rf"encode\.(\d+)\.linear([12])\.{_P}", r"detector.geometry_encoder.layers.\1.mlp.fc\2.\3", "copy"),
          (g + rf"encode\.(\d+)\.norm([123])\.{_P}", r"detector.geometry_encoder.layers.\1.layer_norm\2.\3", "copy")]
    r += _attention_rules(g + r"encode\.(\d+)\.self_attn", r"detector.geometry_encoder.layers.\1.self_attn")
    r += _attention_rules(g + r"encode\.(\d+)\.cross_attn_image", r"detector.geometry_encoder.layers.\1.cross_attn")
    e = r"detector\.transformer\.encoder\.layers\.(\d+)\."
    r += [(e + rf"linear([12])\.{_P}", r"detector.detr_encoder.layers.\1.mlp.fc\2.\3", "copy"),
          (e + rf"norm([123])\.{_P}", r"detector.detr_encoder.layers.\1.layer_norm\2.\3", "copy")]
    r += _attention_rules(e + "self_attn", r"detector.detr_encoder.layers.\1.self_attn")
    r += _attention_rules(e + "cross_attn_image", r"detector.detr_encoder.layers.\1.cross_attn")
    d = r"detector\.transformer\.decoder\."
    r += [(d + rf"(query_embed|reference_points|presence_token)\.weight", r"detector.detr_decoder.\1.weight", "copy"),
          (d + rf"norm\.{_P}", r"detector.detr_decoder.output_layer_norm.\1", "copy"),
          (d + rf"presence_token_out_norm\.{_P}", r"detector.detr_decoder.presence_layer_norm.\1", "copy")]
    for meta, ours in (("presence_token_head", "presence_head"), ("bbox_embed", "box_head"),
                       ("ref_point_head", "ref_point_head"), ("boxRPB_embed_x", "box_rpb_embed_x"),
                       ("boxRPB_embed_y", "box_rpb_embed_y")):
        for i in range(3):
            r.append((d + rf"{meta}\.layers\.{i}\.{_P}", rf"detector.detr_decoder.{ours}.layer{i + 1}.\1", "copy"))
    dl = d + r"layers\.(\d+)\."
    for meta, ours in (("norm1", "vision_cross_attn_layer_norm"), ("catext_norm", "text_cross_attn_layer_norm"),
                       ("norm2", "self_attn_layer_norm"), ("norm3", "mlp_layer_norm")):
        r.append((dl + rf"{meta}\.{_P}", rf"detector.detr_decoder.layers.\1.{ours}.\2", "copy"))
    r.append((dl + rf"linear([12])\.{_P}", r"detector.detr_decoder.layers.\1.mlp.fc\2.\3", "copy"))
    for meta, ours in (("self_attn", "self_attn"), ("ca_text", "text_cross_attn"), ("cross_attn", "vision_cross_attn")):
        r += _attention_rules(dl + meta, rf"detector.detr_decoder.layers.\1.{ours}")
    s = r"detector\.dot_prod_scoring\."
    r += [(s + rf"prompt_mlp\.layers\.([01])\.{_P}", None, "scoring_mlp"),
          (s + rf"prompt_mlp\.out_norm\.{_P}", r"detector.dot_product_scoring.text_mlp_out_norm.\1", "copy"),
          (s + rf"prompt_proj\.{_P}", r"detector.dot_product_scoring.text_proj.\1", "copy"),
          (s + rf"hs_proj\.{_P}", r"detector.dot_product_scoring.query_proj.\1", "copy")]
    h = r"detector\.segmentation_head\."
    r += [(h + rf"pixel_decoder\.(conv_layers|norms)\.(\d+)\.{_P}", r"detector.mask_decoder.pixel_decoder.\1.\2.\3", "copy"),
          (h + rf"mask_predictor\.mask_embed\.layers\.(\d+)\.{_P}", r"detector.mask_decoder.mask_embedder.layers.\1.\2", "copy"),
          (h + rf"instance_seg_head\.{_P}", r"detector.mask_decoder.instance_projection.\1", "copy"),
          (h + rf"semantic_seg_head\.{_P}", r"detector.mask_decoder.semantic_projection.\1", "copy"),
          (h + rf"cross_attn_norm\.{_P}", r"detector.mask_decoder.prompt_cross_attn_norm.\1", "copy")]
    r += _attention_rules(h + "cross_attend_prompt", "detector.mask_decoder.prompt_cross_attn")
    # the SAM decoders' high-resolution convs, which the backbone and interactive neck graphs apply
    for meta, ours in (("sam_mask_decoder", "propagation"), ("interactive_sam_mask_decoder", "interactive")):
        r.append((rf"tracker\.model\.{meta}\.conv_s([01])\.{_P}", rf"{ours}_conv_s\1.\2", "copy"))
    return [(re.compile(p), t, how) for p, t, how in r]


RULES = _rules()
_IGNORED = [(re.compile(p), why) for p, why in IGNORED]


def map_key(key: str):
    """[(our key, how)] for a detector checkpoint key; None when no rule maps it."""
    for pattern, template, how in RULES:
        m = pattern.fullmatch(key)
        if m is None:
            continue
        if how == "scoring_mlp":  # Meta's MLP layers 0 / 1 -> transformers' layer1 / layer2
            return [(f"detector.dot_product_scoring.text_mlp.layer{int(m.group(1)) + 1}.{m.group(2)}", "copy")]
        if how == "qkv":
            return [(m.expand(template).replace("{q}", f"{p}_proj"), f"qkv{i}") for i, p in enumerate("qkv")]
        return [(m.expand(template), how)]
    return None


def ignored_reason(key: str) -> str | None:
    for pattern, why in _IGNORED:
        if pattern.fullmatch(key):
            return why
    return None


# ----------------------------------------------------------------------------------- the file
def find_checkpoint_file(path: str | os.PathLike) -> Path:
    """The 3.1 weights file: ``path`` itself, or the known file name inside a directory (an HF snapshot
    of facebook/sam3.1 holds sam3.1_multiplex.pt)."""
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        for name in CHECKPOINT_FILES:
            if (path / name).is_file():
                return path / name
        raise CheckpointError(f"{path} holds no SAM 3.1 weights ({' or '.join(CHECKPOINT_FILES)}); pass the "
                              "file Meta publishes (facebook/sam3.1: sam3.1_multiplex.pt) with --checkpoint")
    raise CheckpointError(f"checkpoint {path} does not exist; pass Meta's sam3.1_multiplex.pt (or the folder "
                          "holding it) with --checkpoint")


def _load_raw(file: Path, mmap: bool = True) -> dict:
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(file))
        except Exception as exc:  # safetensors raises its own error types for bad headers
            raise CheckpointError(f"{file} is not a readable safetensors file ({exc})") from exc
    import torch

    try:
        data = torch.load(str(file), map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises many types for corrupted or non-torch files
        raise CheckpointError(f"{file} cannot be read as a torch checkpoint ({type(exc).__name__}: {exc})") from exc
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        data = data["model"]  # as Meta's loader unwraps it
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise CheckpointError(f"{file} holds no dict of named tensors; it is not a SAM 3.1 checkpoint")
    return data


def public_keys(state: dict) -> dict:
    """Meta's internal names (sam3_model., sam2_predictor.) renamed to the public ones, as its loader does."""
    if not any(k.startswith(old) for k in state for old, _ in INTERNAL_PREFIXES):
        return state
    renamed = {}
    for k, v in state.items():
        for old, new in INTERNAL_PREFIXES:
            if k.startswith(old):
                k = new + k[len(old):]
                break
        renamed[k] = v
    return renamed


def family_of_keys(keys) -> tuple[str | None, str]:
    """("sam3.1" | "sam3" | None, a phrase saying what gave it away) for a Meta-layout state dict."""
    keys = list(keys)
    if any(".vision_backbone.propagation_convs." in k or ".vision_backbone.interactive_convs." in k for k in keys) \
            or any(k.startswith("tracker.model.") for k in keys):
        return FAMILY, "Meta's SAM 3.1 multiplex layout (tracker.model.*, propagation_convs / interactive_convs necks)"
    if any(".vision_backbone.sam2_convs." in k for k in keys) or \
            any(k.startswith("tracker.") and not k.startswith("tracker.model.") for k in keys):
        return "sam3", "Meta's SAM 3 layout (tracker.<module> without .model., a sam2_convs neck)"
    return None, "no key of a SAM 3 or SAM 3.1 detector"


def detect_family(path: str | os.PathLike) -> tuple[str | None, str]:
    """What ``path`` is: ("sam3", why) for a Hugging Face SAM 3 snapshot or Meta's sam3.pt, ("sam3.1",
    why) for Meta's SAM 3.1 file (or a folder holding it), (None, why) when it is neither."""
    path = Path(path)
    if path.is_dir() and (path / "config.json").is_file():
        try:
            model_type = json.loads((path / "config.json").read_text()).get("model_type")
        except (ValueError, OSError):
            model_type = None
        if model_type == "sam3_video":
            return "sam3", "a Hugging Face SAM 3 snapshot (config.json model_type sam3_video)"
    if path.is_dir() and not any((path / n).is_file() for n in CHECKPOINT_FILES):
        return None, "a folder with neither a SAM 3 config.json nor a SAM 3.1 weights file"
    try:
        file = find_checkpoint_file(path)
        if file.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(file), "pt") as f:
                keys = list(f.keys())
        else:
            keys = list(_load_raw(file, mmap=True))
    except CheckpointError as exc:
        return None, str(exc)
    family, why = family_of_keys(public_keys(dict.fromkeys(keys)))
    return family, why


def check_family(path: str | os.PathLike, family: str) -> None:
    """Raise one CheckpointError when ``path`` is a checkpoint of the other family, naming the flag."""
    found, why = detect_family(path)
    if found is None or found == family:
        return
    flag = "--family sam3.1" if found == FAMILY else "--family sam3 (the default)"
    extra = ""
    if found == "sam3" and "Meta's SAM 3 layout" in why:
        extra = "; SAM 3 is exported from its Hugging Face snapshot (facebook/sam3), not Meta's sam3.pt"
    raise CheckpointError(f"{path} is a {'SAM 3.1' if found == FAMILY else 'SAM 3'} checkpoint ({why}), but "
                          f"--family {family} was asked; export it with {flag}{extra}")


# ----------------------------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class Sam31Sizes:
    """Every size of the detector half, read from the tensors' shapes."""

    image_size: int
    patch_size: int
    grid: int  # F = image_size / patch: tokens per side of the trunk and of neck level 2
    vit_width: int
    vit_depth: int
    vit_heads: int
    vit_mlp: int
    vit_window: int
    vit_global_blocks: tuple[int, ...]
    vit_pretrain_grid: int
    fpn_width: int
    text_width: int
    text_layers: int
    text_heads: int
    text_mlp: int
    text_context: int
    text_projection_dim: int
    vocab_size: int
    d_model: int
    detr_encoder_layers: int
    detr_decoder_layers: int
    detr_ffn: int
    geometry_layers: int
    geometry_roi: int
    num_queries: int
    mask_upsampling_stages: int
    conv_s0_channels: int
    conv_s1_channels: int

    @property
    def mask_size(self) -> int:  # the detector's and tracker's low-resolution masks: neck level 0
        return 4 * self.grid

    def as_dict(self) -> dict:
        d = asdict(self)
        d["vit_global_blocks"] = list(self.vit_global_blocks)
        d["mask_size"] = self.mask_size
        return d


def _count(state: dict, pattern: str) -> int:
    rx = re.compile(pattern)
    found = {int(m.group(1)) for k in state for m in [rx.fullmatch(k)] if m}
    if found and found != set(range(len(found))):
        raise CheckpointError(f"layer indices of {pattern} are not 0..{len(found) - 1}: {sorted(found)}")
    return len(found)


def _shape(state: dict, key: str) -> tuple[int, ...]:
    if key not in state:
        raise CheckpointError(f"the checkpoint has no {key}; it is not a complete SAM 3.1 checkpoint")
    return tuple(state[key].shape)


def rope_sides(rows: list[int]) -> tuple[int, int] | None:
    """(grid F, window) from the row counts of the ViT's RoPE tables (Meta registers window^2 rows for a
    windowed block, F^2 for a global one), or None when they are not such tables. Of two counts the
    window is the one nearer Meta's 24^2: the grid may be the smaller (224 px: 16 < 24, padded)."""
    counts = sorted(set(rows))
    if not counts or len(counts) > 2 or any(math.isqrt(r) ** 2 != r for r in counts):
        return None
    window_rows = min(counts, key=lambda r: abs(r - VIT_WINDOW_DEFAULT ** 2))
    global_rows = next((r for r in counts if r != window_rows), window_rows)
    return math.isqrt(global_rows), math.isqrt(window_rows)


def derive_sizes(state: dict, small_config: dict | None = None) -> Sam31Sizes:
    vit = "detector.backbone.vision_backbone.trunk."
    txt = "detector.backbone.language_backbone.encoder."
    width = _shape(state, vit + "patch_embed.proj.weight")[0]
    patch = _shape(state, vit + "patch_embed.proj.weight")[-1]
    depth = _count(state, re.escape(vit) + r"blocks\.(\d+)\.attn\.qkv\.weight")
    pos_rows = _shape(state, vit + "pos_embed")[1] - 1  # minus the class-token row
    pretrain = math.isqrt(pos_rows)
    if pretrain * pretrain != pos_rows or width % VIT_HEAD_DIM:
        raise CheckpointError(f"ViT position embedding of {pos_rows} rows or width {width} is not a SAM 3.1 ViT's")
    # RoPE tables: windowed blocks have window^2 rows, global blocks F^2 (Meta's ViT registers them)
    rows = {}
    for i in range(depth):
        key = vit + f"blocks.{i}.attn.freqs_cis"
        if key in state:
            rows[i] = state[key].shape[0]
    cfg = small_config or {}
    sides = rope_sides(list(rows.values())) if len(rows) == depth else None
    if sides is not None and len(set(rows.values())) == 2:
        grid, window = sides
        global_blocks = tuple(i for i, r in rows.items() if r == grid * grid)
    elif sides is not None:
        # every block alike: the image is one window, so windowed and global attention are the same
        grid, window = sides
        global_blocks = tuple(cfg.get("vit_global_blocks", ()))
    else:  # no RoPE buffers (a mirror without them): the sizes of Meta's builder, or the small config
        image = int(cfg.get("image_size", FULL_IMAGE_SIZE))
        grid, window = image // patch, VIT_WINDOW_DEFAULT
        default = FULL_GLOBAL_BLOCKS if depth == 32 else None
        global_blocks = tuple(cfg.get("vit_global_blocks", default or ()))
        if not global_blocks:
            raise CheckpointError(f"the checkpoint has no ViT RoPE buffers (attn.freqs_cis) and a {depth}-block ViT; "
                                  f"put a {SMALL_CONFIG} with vit_global_blocks and image_size beside it")
    conv0 = _shape(state, "detector.backbone.vision_backbone.convs.0.conv_1x1.weight")
    sizes = Sam31Sizes(
        image_size=grid * patch, patch_size=patch, grid=grid, vit_width=width, vit_depth=depth,
        vit_heads=width // VIT_HEAD_DIM, vit_mlp=_shape(state, vit + "blocks.0.mlp.fc1.weight")[0],
        vit_window=window, vit_global_blocks=global_blocks, vit_pretrain_grid=pretrain,
        fpn_width=conv0[0],
        text_width=_shape(state, txt + "token_embedding.weight")[1],
        text_layers=_count(state, re.escape(txt) + r"transformer\.resblocks\.(\d+)\.attn\.in_proj_weight"),
        text_heads=_shape(state, txt + "token_embedding.weight")[1] // TEXT_HEAD_DIM,
        text_mlp=_shape(state, txt + "transformer.resblocks.0.mlp.c_fc.weight")[0],
        text_context=_shape(state, txt + "positional_embedding")[0],
        text_projection_dim=_shape(state, txt + "text_projection")[1],
        vocab_size=_shape(state, txt + "token_embedding.weight")[0],
        d_model=_shape(state, "detector.backbone.language_backbone.resizer.weight")[0],
        detr_encoder_layers=_count(state, r"detector\.transformer\.encoder\.layers\.(\d+)\.linear1\.weight"),
        detr_decoder_layers=_count(state, r"detector\.transformer\.decoder\.layers\.(\d+)\.linear1\.weight"),
        detr_ffn=_shape(state, "detector.transformer.encoder.layers.0.linear1.weight")[0],
        geometry_layers=_count(state, r"detector\.geometry_encoder\.encode\.(\d+)\.linear1\.weight"),
        geometry_roi=_shape(state, "detector.geometry_encoder.boxes_pool_project.weight")[-1],
        num_queries=_shape(state, "detector.transformer.decoder.query_embed.weight")[0],
        mask_upsampling_stages=_count(state, r"detector\.segmentation_head\.pixel_decoder\.conv_layers\.(\d+)\.weight"),
        conv_s0_channels=_shape(state, "tracker.model.sam_mask_decoder.conv_s0.weight")[0],
        conv_s1_channels=_shape(state, "tracker.model.sam_mask_decoder.conv_s1.weight")[0],
    )
    if small_config:
        _check_small_config(sizes, small_config)
    return sizes


def _check_small_config(sizes: Sam31Sizes, cfg: dict) -> None:
    derived = cfg.get("derived", {})
    expected = {
        "image_size": cfg.get("image_size"), "vit_width": cfg.get("vit_embed_dim"), "vit_heads": cfg.get("vit_num_heads"),
        "vit_depth": cfg.get("vit_depth"), "vit_global_blocks": tuple(cfg["vit_global_blocks"]) if "vit_global_blocks" in cfg else None,
        "text_width": cfg.get("text_width"), "text_heads": cfg.get("text_heads"), "text_layers": cfg.get("text_layers"),
        "detr_encoder_layers": cfg.get("det_enc_layers"), "detr_decoder_layers": cfg.get("det_dec_layers"),
        "vit_mlp": derived.get("vit_mlp_hidden"), "grid": derived.get("feat_size"), "d_model": derived.get("d_model"),
        "text_context": derived.get("text_context_length"), "vocab_size": derived.get("text_vocab_size"),
        "num_queries": derived.get("det_num_queries"),
    }
    wrong = {k: (v, getattr(sizes, k)) for k, v in expected.items() if v is not None and v != getattr(sizes, k)}
    if wrong:
        raise CheckpointError(f"{SMALL_CONFIG} disagrees with the checkpoint's tensors: " + ", ".join(
            f"{k} {a} (config) vs {b} (tensors)" for k, (a, b) in wrong.items()))


# ---------------------------------------------------------------------------------------- modules
def build_modules(sizes: Sam31Sizes):
    """transformers' SAM 3 detector modules with these sizes (random weights, to be filled)."""
    import torch
    from transformers import CLIPTextConfig, Sam3Config, Sam3Model
    from transformers.models.sam3.configuration_sam3 import Sam3ViTConfig, Sam3VisionConfig
    from transformers.models.sam3.modeling_sam3 import Sam3VisionNeck

    s = sizes
    grid = s.grid
    vit = Sam3ViTConfig(hidden_size=s.vit_width, intermediate_size=s.vit_mlp, num_hidden_layers=s.vit_depth,
                        num_attention_heads=s.vit_heads, image_size=s.image_size, patch_size=s.patch_size,
                        window_size=s.vit_window, global_attn_indexes=list(s.vit_global_blocks),
                        pretrain_image_size=s.vit_pretrain_grid * s.patch_size,
                        layer_norm_eps=1e-5)  # Meta: partial(nn.LayerNorm, eps=1e-5) (vitdet.py)
    vision = Sam3VisionConfig(backbone_config=vit, fpn_hidden_size=s.fpn_width, scale_factors=[4.0, 2.0, 1.0],
                              backbone_feature_sizes=[[4 * grid] * 2, [2 * grid] * 2, [grid] * 2])
    text = CLIPTextConfig(vocab_size=s.vocab_size, hidden_size=s.text_width, intermediate_size=s.text_mlp,
                          projection_dim=s.text_projection_dim, num_hidden_layers=s.text_layers,
                          num_attention_heads=s.text_heads, max_position_embeddings=s.text_context,
                          hidden_act="gelu", layer_norm_eps=1e-5)
    common = dict(hidden_size=s.d_model, num_attention_heads=DETR_HEADS, intermediate_size=s.detr_ffn)
    config = Sam3Config(
        vision_config=vision, text_config=text,
        geometry_encoder_config=dict(common, num_layers=s.geometry_layers, roi_size=s.geometry_roi),
        detr_encoder_config=dict(common, num_layers=s.detr_encoder_layers),
        detr_decoder_config=dict(common, num_layers=s.detr_decoder_layers, num_queries=s.num_queries),
        mask_decoder_config=dict(hidden_size=s.d_model, num_attention_heads=DETR_HEADS,
                                 num_upsampling_stages=s.mask_upsampling_stages),
    )
    config._attn_implementation = "eager"
    from .detector import Sam31DetectorModel

    model = Sam31DetectorModel(Sam3Model(config), Sam3VisionNeck(vision), Sam3VisionNeck(vision), sizes)
    return model.to(torch.float32).eval()


def _convert(tensor, how: str, our_shape):
    if how.startswith("qkv"):
        i = int(how[3:])
        n = tensor.shape[0] // 3
        return tensor[i * n:(i + 1) * n]
    if how == "drop_cls":
        return tensor[:, 1:]
    if how == "transpose":
        return tensor.t()
    return tensor


def map_state(state: dict, model) -> tuple[dict, list[str]]:
    """Our state dict from the checkpoint's, and the checkpoint keys left for the tracker half.

    Strict: raises one CheckpointError listing every unmapped key, every module tensor left unfilled
    and every shape mismatch."""
    ours = model.state_dict()
    mapped, tracker_keys, unknown, wrong = {}, [], [], []
    for key, tensor in state.items():
        targets = map_key(key)
        if targets is None:
            if ignored_reason(key):
                continue
            if key.startswith(TRACKER_PREFIXES):
                tracker_keys.append(key)
                continue
            unknown.append(key)
            continue
        for target, how in targets:
            if target not in ours:
                unknown.append(f"{key} (-> {target}, which the modules lack)")
                continue
            value = _convert(tensor, how, ours[target].shape)
            if tuple(value.shape) != tuple(ours[target].shape):
                wrong.append(f"{key} {tuple(value.shape)} -> {target} {tuple(ours[target].shape)}")
                continue
            if target in mapped:
                wrong.append(f"{key} -> {target}, which another key already filled")
                continue
            mapped[target] = value.float().contiguous()
    unfilled = sorted(set(ours) - set(mapped))
    problems = []
    if unknown:
        problems.append(f"{len(unknown)} checkpoint keys match no rule: {', '.join(unknown[:12])}"
                        + (" ..." if len(unknown) > 12 else ""))
    if wrong:
        problems.append(f"{len(wrong)} shape mismatches: {', '.join(wrong[:12])}" + (" ..." if len(wrong) > 12 else ""))
    if unfilled:
        problems.append(f"{len(unfilled)} module tensors got no weight: {', '.join(unfilled[:12])}"
                        + (" ..." if len(unfilled) > 12 else ""))
    if problems:
        raise CheckpointError("the checkpoint does not fit SAM 3.1's detector: " + "; ".join(problems))
    return mapped, tracker_keys


@dataclass
class Sam31Checkpoint:
    file: Path
    sizes: Sam31Sizes
    small_config: dict | None
    bpe: Path | None  # Meta's BPE vocab beside the file, if there

    @property
    def directory(self) -> Path:
        return self.file.parent


def read_small_config(file: Path) -> dict | None:
    path = file.parent / SMALL_CONFIG
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc})") from exc


def load_detector(path: str | os.PathLike):
    """(Sam31DetectorModel in eval mode and fp32, Sam31Checkpoint) for Meta's SAM 3.1 file at ``path``."""
    import torch

    check_family(path, FAMILY)
    file = find_checkpoint_file(path)
    state = public_keys(_load_raw(file))
    family, why = family_of_keys(state)
    if family != FAMILY:
        raise CheckpointError(f"{file} is not a SAM 3.1 checkpoint ({why})")
    small = read_small_config(file)
    sizes = derive_sizes(state, small)
    model = build_modules(sizes)
    mapped, _tracker_keys = map_state(state, model)
    with torch.no_grad():
        model.load_state_dict(mapped, strict=True)
    bpe = file.parent / BPE_FILE
    return model.eval(), Sam31Checkpoint(file=file, sizes=sizes, small_config=small,
                                         bpe=bpe if bpe.is_file() else None)
