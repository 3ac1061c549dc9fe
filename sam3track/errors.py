"""One exception family for everything a user can get wrong.

Every message names the file, frame, prompt or object at fault and says what to do.
"""


SHOWN_CHARS = 60  # how much of a rejected value a message repeats


def shown(value) -> str:
    """repr(value), cut to a readable length: messages name the bad value, not echo 10 kB of it."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 5] + "...'"


def is_whole_number(value) -> bool:
    """An int or numpy integer, and not a bool (True is an int to Python, never a frame or an id here)."""
    import numpy as np

    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class Sam3TrackError(Exception):
    """Base class of every error sam3track raises on purpose."""


class BundleError(Sam3TrackError):
    """The bundle directory is missing, incomplete, corrupted or too new."""


class VideoError(Sam3TrackError):
    """A video file, image folder or frame cannot be read or written."""


class OutputBusyError(VideoError):
    """Another live run (``pid``) is writing the output ``path``; the message names both."""

    def __init__(self, path, pid, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.pid = pid


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


class UsageError(Sam3TrackError):
    """A job was asked for something it cannot do: a flag's value, a missing input, an output that
    cannot be written (the command line reports it as CliError, the same class)."""


class ArgumentError(Sam3TrackError, ValueError):
    """An argument of an API call has the wrong type or value."""


class BackendError(Sam3TrackError):
    """A backend call failed, or was made after the backend (or its predictor) was closed."""


class CapacityError(Sam3TrackError):
    """A video needs more of a bounded resource (objects, memory rows) than the configuration allows."""


class CapacityWarning(UserWarning):
    """A bounded resource capped what a session does, which it survives: new objects beyond what the
    device pools hold (or beyond max_num_objects) are not made, as the reference's max_num_objects does."""


class SessionBusyError(Sam3TrackError):
    """A session is asked to do something while one of its propagate() generators is still running."""


# A wrong type is also a TypeError, so callers can tell "not a frame index" from "no such frame"
class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of an API call is not of the type it takes."""


class FrameIndexTypeError(FrameIndexError, TypeError):
    """A frame index that is not a whole number."""


class ObjectIdTypeError(ObjectIdError, TypeError):
    """An object id that is not a whole number."""


class PromptTypeError(PromptError, TypeError):
    """Points, boxes or labels that are not numbers."""


def whole_number_argument(value, name: str, error: type[TypeError] = ArgumentTypeError) -> int:
    """`value` as an int; else `error` (a TypeError) naming the argument and the type it takes. The one
    check every public method and the request API make of frame indices, object ids and counts."""
    if is_whole_number(value):
        return int(value)
    raise error(f"{name} must be a whole number (int), not {type(value).__name__} {shown(value)}")


def frame_index_argument(value, name: str = "frame index") -> int:
    return whole_number_argument(value, name, FrameIndexTypeError)


def object_id_argument(value, name: str = "obj_id") -> int:
    return whole_number_argument(value, name, ObjectIdTypeError)
