"""SAM 3's export: a transformers SAM 3 video checkpoint (or a seeded preset) into a sam3track bundle.

`export_bundle` builds the bundle in a temporary sibling directory and renames it into place only when
complete, so an interrupted or failed export never leaves something that looks like a bundle. The
command line is graphs/export.py.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from sam3track.bundle import file_sha256

from ..onnx_export import BundleBuild, ExportError, check_destination, export_module, precision_of
from .checkpoint import load_model, load_tokenizer, validate_checkpoint, weights_sha256

# 2: int32 ids and indices, float32 flags (no int64 or bool inputs); 3: interactive_decoder (clicks and
# boxes), memory_encoder's via_image input, the tracker's multimask settings in config.tracker
FORMAT_VERSION = 3
GRAPHS = ("text_encoder", "backbone", "grounding_head", "propagation_decoder", "interactive_decoder", "memory_encoder",
          "mask_init")
# Sizes used while tracing: 2 or more everywhere, so no axis is mistaken for a broadcastable 1.
TRACE_SIZES = dict(prompts=2, images=2, objects=2, memories=2, pointers=2, memory_rows=4, pointer_rows=4, points=3)


def _export_graph(model, name: str, dims, out_dir: Path, precision: str = "fp32", attention: str = "fused") -> dict:
    from . import specs

    spec = specs.graph_specs(dims)[name]
    return export_module(spec.module(model), spec, specs.sample_inputs(spec, dims, TRACE_SIZES), out_dir,
                         precision=precision, attention=attention)


def _preprocessing(checkpoint: Path, image_size: int) -> dict:
    """Image preprocessing from the snapshot's preprocessor_config.json (the processor's own defaults)."""
    cfg = {}
    path = checkpoint / "preprocessor_config.json"
    if path.is_file():
        cfg = json.loads(path.read_text())
    return {
        "image_size": image_size,
        "resize": "bilinear",
        "rescale_factor": float(cfg.get("rescale_factor", 1 / 255)),
        "image_mean": [float(x) for x in cfg.get("image_mean", [0.5, 0.5, 0.5])],
        "image_std": [float(x) for x in cfg.get("image_std", [0.5, 0.5, 0.5])],
    }


def _model_config(model, dims) -> dict:
    from transformers import Sam3VideoConfig

    cfg = model.config
    trk = model.tracker_model.config
    heuristics = {name: getattr(cfg, name) for name in Sam3VideoConfig.__annotations__
                  if name not in ("detector_config", "tracker_config", "initializer_range")}
    return {
        "heuristics": heuristics,
        "tracker": {
            "num_maskmem": trk.num_maskmem,
            "max_cond_frame_num": trk.max_cond_frame_num,
            "max_object_pointers_in_encoder": trk.max_object_pointers_in_encoder,
            "enable_temporal_pos_encoding_for_object_pointers": trk.enable_temporal_pos_encoding_for_object_pointers,
            "hidden_dim": dims.channels,
            "memory_dim": dims.memory_channels,
            "feature_grid": dims.grid,
            "low_res_mask_size": dims.mask_size,
            "num_multimask_outputs": dims.num_masks,
            # when the SAM head gives 3 masks and keeps the best (transformers _use_multimask): the
            # runtime sets interactive_decoder's multimask flag from these
            "multimask_output_in_sam": trk.multimask_output_in_sam,
            "multimask_output_for_tracking": trk.multimask_output_for_tracking,
            "multimask_min_pt_num": trk.multimask_min_pt_num,
            "multimask_max_pt_num": trk.multimask_max_pt_num,
        },
        "detector": {"num_queries": dims.num_queries, "text_width": dims.text_width},
    }


def _write_tokenizer(checkpoint: Path, out_dir: Path, text_length: int) -> dict:
    tokenizer = load_tokenizer(checkpoint)
    tok_dir = out_dir / "tokenizer"
    tokenizer.save_pretrained(str(tok_dir))
    if not (tok_dir / "tokenizer.json").is_file():
        raise ExportError(f"the tokenizer of {checkpoint} could not be saved as tokenizer.json")
    files = sorted(p.name for p in tok_dir.iterdir())
    return {
        "dir": "tokenizer",
        "files": files,
        "sha256": {f: file_sha256(tok_dir / f) for f in files},
        "max_length": text_length,
        "pad_token_id": int(tokenizer.pad_token_id),
        "padding": "max_length",
    }


def _recorded_checkpoint(checkpoint: Path, tiny_seed: int | None, keep_source: bool) -> str | None:
    """What the manifest's source.checkpoint says: a path, relative for a seeded model kept in the bundle,
    or None when the seeded model was left out (graphs.check rebuilds it from tiny_seed and tiny_preset)."""
    if tiny_seed is None:
        return str(Path(checkpoint).absolute())
    return "source" if keep_source else None


def export_bundle(checkpoint: Path, out: Path, fp16: tuple[str, ...] = (), overwrite: bool = False,
                  tiny_seed: int | None = None, log=print, tiny_preset: str = "tiny",
                  keep_source: bool = True, attention: str = "fused", int8: tuple[str, ...] = ()) -> Path:
    """Build the bundle for `checkpoint` (or a fresh small checkpoint when tiny_seed is set) at `out`.

    ``tiny_preset`` names the small model (graphs.sam3.tiny.PRESETS). ``keep_source=False`` leaves the
    seeded checkpoint out of the bundle (the shipped demo bundle: the runtime never reads it, and
    graphs.check rebuilds it from the seed and preset the manifest records). ``attention``: "fused"
    (ONNX Runtime's MultiHeadAttention op) or "plain" (standard ops only: what ATC, and so
    ``om.convert``, needs); see graphs/sam3/modules.py. ``int8``: graphs to quantise (ONNX Runtime
    dynamic quantisation of their weight MatMuls).
    """
    from . import specs

    out = Path(out).absolute()
    _check_request(checkpoint, out, fp16, int8, overwrite, tiny_seed, tiny_preset, attention)
    with BundleBuild(out, attention, log) as build:
        staging = build.staging
        if tiny_seed is not None:
            from .tiny import PRESETS, write_tiny_checkpoint

            checkpoint = write_tiny_checkpoint(staging / "source", seed=tiny_seed, preset=PRESETS[tiny_preset])
            log(f"wrote {tiny_preset} checkpoint (seed {tiny_seed}) to {out / 'source'}"
                + ("" if keep_source else " (left out of the finished bundle)"))
        model = load_model(checkpoint)
        dims = specs.Dims.from_model(model)
        graphs = {}
        for name in GRAPHS:
            t0 = time.perf_counter()
            graphs[name] = _export_graph(model, name, dims, staging, precision=precision_of(name, fp16, int8),
                                         attention=attention)
            log(f"exported {name:<20} {graphs[name]['bytes'] / 1e6:9.1f} MB  {time.perf_counter() - t0:6.1f} s")
        manifest = _manifest(checkpoint, model, dims, graphs, staging, tiny_seed, tiny_preset, keep_source)
        if not keep_source:
            shutil.rmtree(staging / "source", ignore_errors=True)
        build.publish(manifest)
    return out


def _check_request(checkpoint, out: Path, fp16, int8, overwrite: bool, tiny_seed, tiny_preset: str,
                   attention: str) -> None:
    """Everything that can be refused before any work: the destination, flags, the checkpoint, the preset."""
    check_destination(out, overwrite, attention)
    for flag, names in (("--fp16", fp16), ("--int8", int8)):
        unknown = [g for g in names if g not in GRAPHS]
        if unknown:
            raise ExportError(f"{flag} names unknown graphs {unknown}; choose from {', '.join(GRAPHS)}")
    both = sorted(set(fp16) & set(int8))
    if both:
        raise ExportError(f"{', '.join(both)}: named in both --fp16 and --int8; a graph has one precision")
    if checkpoint is not None:
        from ..sam31.checkpoint import check_family

        check_family(checkpoint, "sam3")  # a SAM 3.1 file: say which flag exports it
        validate_checkpoint(checkpoint)  # fail fast, before creating anything
    if tiny_seed is not None:
        from .tiny import PRESETS

        if tiny_preset not in PRESETS:
            raise ExportError(f"unknown small-model preset {tiny_preset!r}; choose from {', '.join(PRESETS)}")


def _manifest(checkpoint, model, dims, graphs: dict, staging: Path, tiny_seed, tiny_preset: str,
              keep_source: bool) -> dict:
    """The SAM 3 manifest (the exporter record is added by the caller once every graph is out)."""
    return {
        "format_version": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "graphs": graphs,
        "preprocessing": _preprocessing(Path(checkpoint), dims.image_size),
        "text": {"max_length": dims.text_length},
        "config": _model_config(model, dims),
        "tokenizer": _write_tokenizer(Path(checkpoint), staging, dims.text_length),
        "source": {
            "checkpoint": _recorded_checkpoint(checkpoint, tiny_seed, keep_source),
            "model_type": model.config.model_type,
            "tiny_seed": tiny_seed,
            "tiny_preset": tiny_preset if tiny_seed is not None else None,
            "weights_sha256": weights_sha256(checkpoint),
            "parameters": sum(p.numel() for p in model.parameters()),
        },
    }
