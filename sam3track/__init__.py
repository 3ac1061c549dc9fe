"""sam3track: SAM 3 video tracking from exported graphs, without PyTorch at run time."""

from .errors import (ArgumentError, BackendError, BundleError, CapacityError, FrameIndexError, ObjectIdError,
                     PromptError, Sam3TrackError, SessionBusyError, SessionClosedError, VideoError)
from .results import FrameResult

__version__ = "0.1.0"


def load(bundle_dir, backend: str = "onnxruntime", device: str = "cpu", **options):
    """Load a bundle and return a Predictor (see sam3track.predictor.Predictor)."""
    from .predictor import Predictor

    return Predictor.load(bundle_dir, backend=backend, device=device, **options)


__all__ = ["load", "FrameResult", "Sam3TrackError", "ArgumentError", "BackendError", "BundleError", "CapacityError",
           "VideoError", "PromptError", "FrameIndexError", "ObjectIdError", "SessionBusyError", "SessionClosedError", "__version__"]
