"""One exception family for everything a user can get wrong.

Every message names the file, frame, prompt or object at fault and says what to do.
"""


class Sam3TrackError(Exception):
    """Base class of every error sam3track raises on purpose."""


class BundleError(Sam3TrackError):
    """The bundle directory is missing, incomplete, corrupted or too new."""


class VideoError(Sam3TrackError):
    """A video file, image folder or frame cannot be read or written."""


class PromptError(Sam3TrackError):
    """A prompt is empty or malformed."""


class FrameIndexError(Sam3TrackError, IndexError):
    """A frame index lies outside the video."""


class ObjectIdError(Sam3TrackError, KeyError):
    """An object id is not tracked in this session."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


class SessionClosedError(Sam3TrackError):
    """The session was closed; start a new one."""
