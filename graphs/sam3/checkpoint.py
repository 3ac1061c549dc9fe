"""Finding, validating and loading a SAM 3 video checkpoint directory (a Hugging Face snapshot)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..onnx_export import CheckpointError

EXPECTED_MODEL_TYPE = "sam3_video"
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt")


def _weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"{index} is not a valid safetensors index ({exc}); download the snapshot again")
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise CheckpointError(
                f"{directory} is a partial snapshot: {index.name} lists {len(shards)} weight shards but "
                f"{', '.join(missing)} is missing; finish the download (huggingface-cli download facebook/sam3)"
            )
        return [directory / s for s in shards]
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    raise CheckpointError(
        f"{directory} has no weights (model.safetensors or model.safetensors.index.json); "
        "point --checkpoint at a complete facebook/sam3 snapshot"
    )


def validate_checkpoint(directory: str | os.PathLike) -> dict:
    """Check the directory before any heavy work; return its parsed config.json."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist; pass a local facebook/sam3 snapshot")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{directory} has no config.json; it is not a Hugging Face checkpoint directory")
    try:
        config = json.loads(config_path.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{config_path} is not valid JSON ({exc}); download the snapshot again")
    model_type = config.get("model_type")
    if model_type != EXPECTED_MODEL_TYPE:
        raise CheckpointError(
            f"{config_path} describes model_type {model_type!r}, not {EXPECTED_MODEL_TYPE!r}; sam3track exports "
            "SAM 3 video checkpoints (facebook/sam3)"
        )
    _weight_files(directory)
    if not any((directory / f).is_file() for f in TOKENIZER_FILES):
        raise CheckpointError(
            f"{directory} has no tokenizer (tokenizer.json, or vocab.json + merges.txt); the snapshot is incomplete"
        )
    for sub in ("detector_config", "tracker_config"):
        if not isinstance(config.get(sub), dict):
            raise CheckpointError(f"{config_path} has no {sub}; it is not a complete SAM 3 video config")
    return config


def weights_sha256(directory: str | os.PathLike) -> dict[str, str]:
    out = {}
    for path in _weight_files(Path(directory)):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        out[path.name] = digest.hexdigest()
    return out


def load_model(directory: str | os.PathLike):
    """Load the reference model exactly as a user would, offline, in eval mode and fp32."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import Sam3VideoModel

    validate_checkpoint(directory)
    try:
        model = Sam3VideoModel.from_pretrained(
            str(directory), local_files_only=True, attn_implementation="eager", dtype=torch.float32
        )
    except Exception as exc:  # transformers raises many types for corrupted files
        raise CheckpointError(f"transformers could not load {directory}: {exc}") from exc
    return model.eval()


def load_tokenizer(directory: str | os.PathLike):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:
        raise CheckpointError(f"transformers could not load the tokenizer in {directory}: {exc}") from exc
