"""The predictor: a loaded bundle on a backend, from which sessions start."""

from __future__ import annotations

from pathlib import Path

from .backends import create_backend
from .bundle import Bundle
from .config import TrackerConfig
from .errors import SessionClosedError
from .session import Session
from .tokenizer import PromptTokenizer


class Predictor:
    def __init__(self, bundle: Bundle, backend, config: TrackerConfig):
        self.bundle, self.backend, self.config = bundle, backend, config
        self.tokenizer = PromptTokenizer(bundle.tokenizer_file, config.text_length, config.pad_token_id)
        self.graphs = {name: backend.load(name, str(bundle.graph_path(name))) for name in bundle.manifest["graphs"]}
        self.closed = False

    @classmethod
    def load(cls, bundle_dir, backend: str = "onnxruntime", device: str = "cpu", verify: bool = True,
             threads: int | None = None, **config_overrides) -> "Predictor":
        """Open and check a bundle, then load its graphs. Keyword overrides change TrackerConfig fields,
        e.g. mask_nms=False, fill_holes=False to compare with transformers."""
        bundle = Bundle.open(Path(bundle_dir), verify=verify)
        config = TrackerConfig.from_manifest(bundle.manifest, **config_overrides)
        options = {"threads": threads} if threads else {}
        return cls(bundle, create_backend(backend, device, **options), config)

    def start_session(self, source=None) -> Session:
        """source: a video file, an image folder, an array or sequence of RGB frames, a FrameSource, or
        None for a live stream fed through session.track(frame)."""
        if self.closed:
            raise SessionClosedError("this predictor is closed; load the bundle again")
        owned = False
        if source is not None:
            from .video import open_source
            from .video.reader import FrameSource

            owned = not isinstance(source, FrameSource)
            source = open_source(source)
        session = Session(self, source)
        session._owns_source = owned
        return session

    @property
    def transfers(self):
        return self.backend.transfers

    def close(self) -> None:
        if not self.closed:
            self.graphs = {}  # drop the inference sessions with the backend
            self.backend.close()
            self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
