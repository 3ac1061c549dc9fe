"""Helpers shared by the reference scripts (run in the reference env; numpy<2, torch 2.14.1, av).

Frames: an mp4 is decoded here exactly as the project's runtime decodes it (PyAV, first video stream,
frames in decode order, ``frame.to_ndarray(format="rgb24")``, see sam3track/video/video_file.py) and
written as lossless PNGs (00000.png, ...), which Meta's own image-folder loader reads
(io_utils.load_video_frames_from_image_folder: PIL -> RGB -> resize to image_size -> fp16). Both sides
therefore start from identical uint8 pixels; ``frame_sha256`` records them so the project side can check.

Masks: stored bit-packed (np.packbits over each mask's flattened H*W, row-major) with their shape;
``unpack_masks`` inverts it.

Digest: sha256 over (name, dtype, shape, bytes) of every array of every response, in order: equal
digests mean byte-identical outputs (npz files themselves carry zip timestamps, so compare digests).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CLIPS = REPO / "examples" / "clips"


# ------------------------------------------------------------------------------------------ frames
def decode_frames(mp4: Path, num_frames: int) -> np.ndarray:
    """First ``num_frames`` frames of ``mp4`` as uint8 [T, H, W, 3], decoded as sam3track does."""
    import av

    mp4 = Path(mp4)
    if not mp4.is_file():
        raise FileNotFoundError(f"clip not found: {mp4}")
    frames = []
    with av.open(str(mp4), mode="r") as c:
        stream = c.streams.video[0]
        for f in c.decode(stream):
            frames.append(np.ascontiguousarray(f.to_ndarray(format="rgb24")))
            if len(frames) == num_frames:
                break
    if len(frames) < num_frames:
        raise ValueError(f"{mp4} has only {len(frames)} frames, {num_frames} asked")
    return np.stack(frames)


def frame_sha256(frames: np.ndarray) -> list[str]:
    return [hashlib.sha256(np.ascontiguousarray(f).tobytes()).hexdigest() for f in frames]


def write_png_folder(frames: np.ndarray, folder: Path) -> Path:
    """Lossless PNG frames named as Meta's image-folder loader sorts them (int(stem))."""
    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(frames):
        Image.fromarray(f, mode="RGB").save(folder / f"{i:05d}.png", compress_level=1)
    # read back: PNG is lossless, prove it for these files
    for i, f in enumerate(frames):
        back = np.asarray(Image.open(folder / f"{i:05d}.png").convert("RGB"))
        if not np.array_equal(back, f):
            raise RuntimeError(f"PNG round trip changed frame {i} in {folder}")
    return folder


# ------------------------------------------------------------------------------------------ masks
def pack_masks(masks: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    masks = np.asarray(masks)
    if masks.dtype != np.bool_:
        raise TypeError(f"masks must be bool, got {masks.dtype}")
    n = masks.shape[0]
    hw = int(np.prod(masks.shape[1:]))
    return np.packbits(masks.reshape(n, hw), axis=1), tuple(int(s) for s in masks.shape)


def unpack_masks(packed: np.ndarray, shape) -> np.ndarray:
    shape = tuple(int(s) for s in shape)
    n = shape[0]
    hw = int(np.prod(shape[1:])) if len(shape) > 1 else 0
    return np.unpackbits(packed, axis=1, count=hw).reshape(shape).astype(bool)


# ------------------------------------------------------------------------------------------ digests
def update_digest(h, name: str, a: np.ndarray) -> None:
    a = np.ascontiguousarray(a)
    h.update(name.encode() + b"\0" + str(a.dtype).encode() + b"\0" + str(a.shape).encode() + b"\0")
    h.update(a.tobytes())


def to_numpy(x):
    try:
        import torch

        if isinstance(x, torch.Tensor):
            return x.detach().cpu().numpy()
    except ImportError:  # pragma: no cover
        pass
    return x


def jsonable(x, depth=0):
    """Small JSON view of a Python/numpy/torch value (for non-array response fields and internals)."""
    x = to_numpy(x)
    if isinstance(x, np.ndarray):
        if x.size <= 64:
            return x.tolist()
        return {"array": str(x.dtype), "shape": list(x.shape)}
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, (np.bool_,)):
        return bool(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in x.items()} if depth < 6 else "..."
    if isinstance(x, (list, tuple, set)):
        seq = sorted(x) if isinstance(x, set) else list(x)
        return [jsonable(v, depth + 1) for v in seq] if depth < 6 else "..."
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return repr(x)[:200]


# ------------------------------------------------------------------------------------------ environment facts
def run_facts(threads: int) -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "threads": threads,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "argv": sys.argv,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def setup_threads(threads: int) -> None:
    """Fixed thread counts: outputs are bit-reproducible across processes at one thread count."""
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass


def write_json(path: Path, obj) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".partial")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=False) + "\n")
    tmp.rename(path)


def read_config(checkpoint: Path, config: Path | None = None) -> dict:
    """The builder sizes saved beside a checkpoint by make_checkpoint.py (small_config.json)."""
    p = Path(config) if config else Path(checkpoint).parent / "small_config.json"
    if not p.is_file():
        raise FileNotFoundError(f"config JSON not found: {p} (make_checkpoint.py writes it beside the "
                                f"checkpoint; pass --config)")
    return json.loads(p.read_text())
