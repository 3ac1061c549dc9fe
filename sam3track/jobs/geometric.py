"""Clicks and boxes of a track job (``--point``, ``--box``, ``--obj-id`` of ``sam3track track``):
parsing, grouping into ``session.add_prompt`` calls, and the checks that need the video.

Rules (also in ``sam3track track --help``):

- ``--point FRAME:X,Y[:LABEL]``: a click in video pixels, LABEL 1 (positive, the default) or 0
  (negative); ``--box FRAME:X0,Y0,X1,Y1``: a box in video pixels.
- ``--obj-id ID`` applies to every ``--point`` / ``--box`` after it, up to the next ``--obj-id``.
- Without an object id, the clicks on one frame form one new object, and each box is a new object.
- With an object id, the clicks (and at most one box) of that object on one frame are one
  ``add_prompt`` call; an id not tracked yet makes a new object with that id.
- Calls are made in command-line order of each group's first option.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sam3track.errors import UsageError

POINT_FORM = "FRAME:X,Y[:LABEL]"
BOX_FORM = "FRAME:X0,Y0,X1,Y1"


@dataclass(frozen=True)
class GeometricOption:
    """One --point or --box from the command line."""

    option: str  # "--point" or "--box"
    text: str  # as typed, for messages
    frame: int
    coords: tuple[float, ...]  # (x, y) or (x0, y0, x1, y1), video pixels
    label: int = 1
    obj_id: int | None = None

    def __str__(self) -> str:
        return f"{self.option} {self.text}"

    def to_json(self) -> dict:
        return {"option": self.option, "frame": self.frame, "coords": list(self.coords), "label": self.label,
                "obj_id": self.obj_id}


@dataclass
class PromptCall:
    """The arguments of one session.add_prompt(points=..., boxes=...) call."""

    frame_index: int
    obj_id: int | None
    points: list[list[float]] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    box: list[float] | None = None
    options: list[GeometricOption] = field(default_factory=list)

    def kwargs(self) -> dict:
        out: dict = {"frame_index": self.frame_index, "obj_id": self.obj_id}
        if self.points:
            out["points"], out["labels"] = self.points, self.labels
        if self.box is not None:
            out["boxes"] = self.box
        return out


def _numbers(text: str, count: int) -> tuple[float, ...] | None:
    parts = text.split(",")
    if len(parts) != count:
        return None
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        return None
    return values if all(math.isfinite(v) for v in values) else None


def _frame(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 0 else None


def parse_point(text: str, obj_id: int | None = None) -> GeometricOption:
    """``FRAME:X,Y[:LABEL]`` -> a GeometricOption; UsageError naming the option and value if malformed."""
    parts = text.split(":")
    where = f"--point {text}"
    if len(parts) not in (2, 3):
        raise UsageError(f"{where}: expected {POINT_FORM}, e.g. --point 0:320,180 or --point 0:320,180:0")
    frame, xy = _frame(parts[0]), _numbers(parts[1], 2)
    if frame is None:
        raise UsageError(f"{where}: FRAME {parts[0]!r} must be a whole number >= 0 (expected {POINT_FORM})")
    if xy is None:
        raise UsageError(f"{where}: X,Y {parts[1]!r} must be two numbers in video pixels (expected {POINT_FORM})")
    label = 1
    if len(parts) == 3:
        if parts[2].strip() not in ("0", "1"):
            raise UsageError(f"{where}: LABEL {parts[2]!r} must be 1 (positive click) or 0 (negative click)")
        label = int(parts[2])
    return GeometricOption("--point", text, frame, xy, label, obj_id)


def parse_box(text: str, obj_id: int | None = None) -> GeometricOption:
    """``FRAME:X0,Y0,X1,Y1`` -> a GeometricOption; UsageError naming the option and value if malformed."""
    parts = text.split(":")
    where = f"--box {text}"
    if len(parts) != 2:
        raise UsageError(f"{where}: expected {BOX_FORM}, e.g. --box 10:100,50,300,200")
    frame, box = _frame(parts[0]), _numbers(parts[1], 4)
    if frame is None:
        raise UsageError(f"{where}: FRAME {parts[0]!r} must be a whole number >= 0 (expected {BOX_FORM})")
    if box is None:
        raise UsageError(f"{where}: X0,Y0,X1,Y1 {parts[1]!r} must be four numbers in video pixels "
                       f"(expected {BOX_FORM})")
    if box[2] <= box[0] or box[3] <= box[1]:
        raise UsageError(f"{where}: the box needs X1 > X0 and Y1 > Y0 (top-left corner first)")
    return GeometricOption("--box", text, frame, box, 1, obj_id)


def group_calls(options: list[GeometricOption]) -> list[PromptCall]:
    """The add_prompt calls the options make, in command-line order (rules in the module doc)."""
    calls: list[PromptCall] = []
    by_key: dict[tuple, PromptCall] = {}
    for opt in options:
        if opt.option == "--box" and opt.obj_id is None:
            key = ("box", len(calls))  # each box without an id: a new object of its own
        elif opt.obj_id is None:
            key = ("clicks", opt.frame)  # the unnamed clicks of one frame: one new object
        else:
            key = ("id", opt.obj_id, opt.frame)
        call = by_key.get(key)
        if call is None:
            call = by_key[key] = PromptCall(opt.frame, opt.obj_id)
            calls.append(call)
        if opt.option == "--box":
            if call.box is not None:
                raise UsageError(f"{opt}: object {opt.obj_id} already has a box on frame {opt.frame} "
                               f"({call.options[[o.option for o in call.options].index('--box')]}); "
                               "give one box per object and frame, or a new --obj-id")
            call.box = list(opt.coords)
        else:
            call.points.append(list(opt.coords))
            call.labels.append(opt.label)
        call.options.append(opt)
    return calls


def check_in_video(options: list[GeometricOption], start: int, stop: int, width: int, height: int) -> None:
    """Every prompt lies on a processed frame and inside the picture (UsageError naming the option)."""
    for opt in options:
        if not start <= opt.frame < stop:
            raise UsageError(f"{opt}: frame {opt.frame} is outside the frames processed ({start}..{stop - 1}); "
                           "prompt a frame in that range, or change --start-frame / --max-frames")
        xs, ys = opt.coords[0::2], opt.coords[1::2]
        if any(not 0 <= x <= width for x in xs) or any(not 0 <= y <= height for y in ys):
            raise UsageError(f"{opt}: outside the {width}x{height} frame (video pixels: x 0..{width}, "
                           f"y 0..{height})")
