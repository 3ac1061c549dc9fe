"""Export Meta's SAM 3.1 checkpoint into a sam3track bundle.

    python -m graphs.export --family sam3.1 --checkpoint sam3.1_multiplex.pt --out BUNDLE [--bpe VOCAB.gz]
    python -m graphs.export --family sam3.1 --tiny --out BUNDLE   # the reference harness's seeded checkpoint

The bundle holds the detector-side graphs (graphs/sam31/detector.py), the tracker graphs
(graphs/sam31/tracker.py: propagation decoder over buckets, memory encoder, interactive decoder, mask
init), Meta's tokenizer as a tokenizer.json (graphs/sam31/tokenizer.py) and a manifest with
``family: "sam3.1"``, the preprocessing Meta applies to frames, the geometry, and the settings of Meta's
builder a runtime needs. The runtime does not run SAM 3.1 bundles yet and refuses them with one clear
error (sam3track/bundle.py).
"""

from __future__ import annotations

import time
from pathlib import Path

from sam3track.bundle import file_sha256

from ..onnx_export import BundleBuild, ExportError, check_destination, export_module, precision_of
from . import checkpoint as ckpt
from . import detector

# Sizes used while tracing: 2 or more, so no axis is mistaken for a broadcastable 1 (prompts too: the
# grounding head's text rows may be 1 or images, and is traced at images).
TRACE_SIZES = dict(images=2, prompts=2, boxes=3)
META_COMMIT = "96914d2425f90a64f45ca977c2b5165418099543"  # the Meta source these settings were read from

# Settings of Meta's SAM 3.1 predictor as build_sam3_multiplex_video_predictor builds it (model_builder.py
# and the classes' defaults). tests/test_sam31_export.py compares every value with the predictor built in
# the reference env (reference/sam31/builder_config.py). Size-dependent ones come from the checkpoint.
HEURISTICS = dict(  # Sam3MultiplexTrackingWithInteractivity: detection, association, hotstart, output
    score_threshold_detection=0.4, new_det_thresh=0.65, det_nms_thresh=0.1, det_nms_use_iom=True,
    suppress_det_close_to_boundary=True, image_only_det_thresh=0.5, assoc_iou_thresh=0.1,
    trk_assoc_iou_thresh=0.5, o2o_matching_masklets_enable=False, hotstart_delay=15, hotstart_unmatch_thresh=8,
    hotstart_dup_thresh=8, suppress_unmatched_only_within_hotstart=False,
    suppress_overlapping_based_on_recent_occlusion_threshold=0.7, allow_unoccluded_to_suppress=False,
    init_trk_keep_alive=0, max_trk_keep_alive=8, min_trk_keep_alive=-4,
    decrease_trk_keep_alive_for_empty_masklets=False, fill_hole_area=0, sprinkle_removal_area=0,
    recondition_every_nth_frame=16, use_iom_recondition=True, iom_thresh_recondition=0.5,
    iou_thresh_recondition=0.8, reconstruction_bbox_iou_thresh=-1, reconstruction_bbox_det_score=0.8,
    masklet_confirmation_enable=True, masklet_confirmation_consecutive_det_thresh=3, max_num_objects=16,
    bucket_capacity=16, postprocess_batch_size=16, use_batched_grounding=True, batched_grounding_batch_size=16,
    max_num_kboxes=0, refinement_detector_cond_frame_removal_window=120, reapply_no_object_pointer=False,
    use_prev_mem_frame=False, use_stateless_refinement=False,
)
TRACKER = dict(  # the multiplex video tracker (model.tracker.model)
    multiplex_count=16, num_maskmem=7, max_obj_ptrs_in_encoder=16, max_cond_frames_in_attn=4,
    num_multimask_outputs=3, multimask_output_in_sam=True, multimask_output_for_tracking=True,
    multimask_min_pt_num=0, multimask_max_pt_num=1, use_multimask_token_for_obj_ptr=True,
    sigmoid_scale_for_mem_enc=2.0, sigmoid_bias_for_mem_enc=-1.0, apply_sigmoid_to_mask_logits_for_mem_enc=True,
    binarize_mask_from_pts_for_mem_enc=False, non_overlap_masks_for_mem_enc=False, non_overlap_masks_for_output=True,
    object_score_logit_threshold=0.0, iou_prediction_use_sigmoid=False, use_maskmem_tpos_v2=True,
    save_image_features=True, condition_as_mask_input=True, condition_as_mask_input_fg=1.0,
    condition_as_mask_input_bg=0.0, add_output_suppression_embeddings=True, add_object_conditional_embeddings=False,
    use_mask_input_as_output_without_sam=True, directly_add_no_mem_embed=True, use_linear_no_obj_ptr=True,
    fixed_no_obj_ptr=True, use_no_obj_ptr=True, add_tpos_enc_to_obj_ptrs=True, proj_tpos_enc_in_obj_ptrs=True,
    use_signed_tpos_enc_to_obj_ptrs=False, sincos_tpos_enc=True, only_obj_ptrs_in_the_past_for_eval=False,
    memory_temporal_stride_for_eval=1, keep_first_cond_frame=False, add_all_frames_to_correct_as_cond=False,
    clear_non_cond_mem_around_input=False, max_point_num_in_prompt_enc=16, use_memory_selection=False,
)
PREDICTOR = dict(default_output_prob_thresh=0.5)
# The full-size SAM 3.1 (Meta's builder), beside which a seeded small checkpoint is described.
FULL_GEOMETRY = dict(image_size=1008, grid=72, vit_width=1024, vit_depth=32, vit_heads=16, vit_mlp=4736,
                     vit_global_blocks=[7, 15, 23, 31], text_width=1024, text_layers=24, text_heads=16,
                     detr_encoder_layers=6, detr_decoder_layers=6, num_queries=200, mask_size=288)


def tracker_sizes(sizes) -> dict:
    """The tracker's size-dependent settings for this checkpoint (Meta derives them from the image size)."""
    return dict(image_size=sizes.image_size, backbone_stride=sizes.patch_size, hidden_dim=sizes.d_model,
                mem_dim=sizes.d_model, low_res_mask_size=4 * sizes.grid, input_mask_size=16 * sizes.grid,
                sam_image_embedding_size=sizes.grid)


def preprocessing(sizes) -> dict:
    """What Meta does to a frame before the backbone (io_utils.py, image-folder loader), which a runtime must
    copy for the same features. tests/test_sam31_export.py reproduces Meta's stored frames bit for bit
    with these steps (PIL + numpy)."""
    return {
        "image_size": sizes.image_size,
        "resize": "pil_bilinear",  # torchvision resize of a PIL image = PIL Image.resize(BILINEAR), area-aware
        "resize_note": "PIL.Image.resize((S, S), BILINEAR) of the RGB frame (aspect ratio not kept), as "
                       "torchvision.transforms.functional.resize does it for a PIL image",
        "rescale_factor": 1 / 255,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "storage_dtype": "float16",
        "steps": ["x = float32(uint8) / 255 (to_tensor)", "x = float16(x) (frames are stored as float16)",
                  "x = float16(x - mean) (in float16)", "x = float16(x / std) (in float16)",
                  "pixel_values = float32(x)"],
    }


def _tokenizer(bpe: Path, out_dir: Path, length: int) -> dict:
    from .tokenizer import PAD_ID, write_tokenizer

    tok_dir = out_dir / "tokenizer"
    write_tokenizer(bpe, tok_dir, length)
    files = sorted(p.name for p in tok_dir.iterdir())
    return {
        "dir": "tokenizer", "files": files, "sha256": {f: file_sha256(tok_dir / f) for f in files},
        "max_length": length, "pad_token_id": PAD_ID, "padding": "max_length",
        "truncation": "to max_length, the last id set to <end_of_text> (Meta's SimpleTokenizer)",
        "source": {"file": bpe.name, "sha256": file_sha256(bpe)},
        # Meta's attention mask is ids != pad id: text_encoder returns it as text_mask
        "mask": "text_encoder output text_mask (input_ids != 0)",
    }


def _find_bpe(checkpoint_info, bpe: Path | None) -> Path:
    if bpe is not None:
        if not Path(bpe).is_file():
            raise ExportError(f"--bpe {bpe} does not exist")
        return Path(bpe)
    if checkpoint_info.bpe is not None:
        return checkpoint_info.bpe
    raise ExportError(f"no tokenizer vocab: {ckpt.BPE_FILE} is not beside {checkpoint_info.file}; pass --bpe PATH "
                      f"(Meta ships it in its repository as sam3/assets/{ckpt.BPE_FILE})")


def tiny_checkpoint() -> Path:
    """The seeded small SAM 3.1 checkpoint of the reference harness (made by Meta's own builder there)."""
    from . import reference as ref

    env = ref.find_env()
    if env is None:
        raise ExportError(f"--tiny --family sam3.1 exports the seeded checkpoint Meta's own builder makes in the "
                          f"SAM 3.1 reference environment, and {ref.missing_reason()}")
    return ref.checkpoint_dir(env) / ckpt.CHECKPOINT_FILES[0]


def export_bundle(checkpoint: Path | None, out: Path, overwrite: bool = False, tiny: bool = False, log=print,
                  attention: str = "fused", bpe: Path | None = None, fp16: tuple[str, ...] = (),
                  int8: tuple[str, ...] = ()) -> Path:
    """Build the SAM 3.1 bundle of ``checkpoint`` (Meta's file or its folder; ``tiny``: the harness's
    seeded one) at ``out``."""
    from .tracker_check import export_tracker_graphs

    out = Path(out).absolute()
    check_destination(out, overwrite, attention)
    for flag, names in (("--fp16", fp16), ("--int8", int8)):
        unknown = [g for g in names if g not in detector.GRAPHS]
        if unknown:
            raise ExportError(f"{flag} names {unknown}, which are not SAM 3.1 detector graphs; choose from "
                              f"{', '.join(detector.GRAPHS)} (the tracker graphs are exported in fp32 only)")
    started = time.perf_counter()
    if tiny:
        checkpoint = tiny_checkpoint()
    ckpt.check_family(checkpoint, ckpt.FAMILY)  # before anything heavy
    model, info = ckpt.load_detector(checkpoint)
    bpe = _find_bpe(info, bpe)
    dims = detector.Dims.from_sizes(info.sizes)
    specs = detector.graph_specs(dims)
    with BundleBuild(out, attention, log, started) as build:
        staging = build.staging
        graphs = {}
        for name in detector.GRAPHS:
            t0 = time.perf_counter()
            spec = specs[name]
            graphs[name] = export_module(spec.module(model), spec, detector.sample_inputs(spec, dims, TRACE_SIZES),
                                         staging, precision=precision_of(name, fp16, int8), attention=attention)
            log(f"exported {name:<20} {graphs[name]['bytes'] / 1e6:9.1f} MB  {time.perf_counter() - t0:6.1f} s")
        t0 = time.perf_counter()
        tracker_graphs = export_tracker_graphs(ckpt.public_keys(ckpt._load_raw(info.file)), staging,
                                               attention=attention, image_size=info.sizes.image_size)
        for name, entry in tracker_graphs.items():
            graphs[name] = entry
            log(f"exported {name:<20} {entry['bytes'] / 1e6:9.1f} MB")
        log(f"tracker graphs: {time.perf_counter() - t0:.1f} s")
        manifest = _manifest(info, model, graphs, bpe, staging, tiny)
        build.publish(manifest)
    return out


def _manifest(info, model, graphs: dict, bpe: Path, staging: Path, tiny: bool) -> dict:
    """The SAM 3.1 manifest (the exporter record is added by the caller once every graph is out)."""
    sizes = info.sizes
    return {
        "format_version": 3,
        "family": ckpt.FAMILY,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "graphs": graphs,
        "preprocessing": preprocessing(sizes),
        "text": {"max_length": sizes.text_context},
        "tokenizer": _tokenizer(bpe, staging, sizes.text_context),
        "config": _config(sizes),
        "source": {
            "checkpoint": str(info.file.absolute()),
            "model_type": "sam3.1_multiplex",
            "tiny": bool(tiny),
            "tiny_seed": 0 if tiny else None,
            "weights_sha256": {info.file.name: file_sha256(info.file)},
            "parameters": sum(p.numel() for p in model.parameters()),
        },
    }


def _config(sizes) -> dict:
    """The manifest's "config": the runtime's heuristics and tracker settings, the detector's outputs, sizes."""
    return {
        "heuristics": dict(HEURISTICS),
        "tracker": {**TRACKER, **tracker_sizes(sizes)},
        "predictor": dict(PREDICTOR),
        "detector": {"num_queries": sizes.num_queries, "text_width": sizes.d_model,
                     "pred_logits": "Meta's joint logits: inverse_sigmoid(sigmoid(class) * sigmoid(presence))"
                                    " (eps 1e-3), clamped to +-10; sigmoid gives the detection score",
                     "pred_boxes": "xyxy, normalised to [0, 1]"},
        "geometry": sizes.as_dict(),
        "full_geometry": dict(FULL_GEOMETRY),
        "is_full_size": all(sizes.as_dict().get(k) == v for k, v in FULL_GEOMETRY.items()),
        "round_levels": "backbone / interactive_neck round_levels: 1 = the tracker levels rounded to "
                        "bfloat16 as Meta's single-frame grounding (text add_prompt) does; 0 = float32, as "
                        "its batched grounding during propagate_in_video",
        "meta_commit": META_COMMIT,
    }


__all__ = ["export_bundle", "ExportError", "CheckpointError"]
