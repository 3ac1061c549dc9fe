"""Errors of the converter: one family under sam3track's, so callers catch one base class."""

from sam3track.errors import Sam3TrackError


class ConversionError(Sam3TrackError):
    """The bundle cannot be converted as asked; the message names the graph and what to change."""


class PlanError(ConversionError):
    """A shape/gear plan that ATC would refuse (too many profiles, two dynamic options, a -1 without a value)."""


class PrepassError(ConversionError):
    """The ONNX graph cannot be made ATC-ready (custom-domain op, shape mismatch, rewrite changed the outputs)."""


class AtcError(ConversionError):
    """atc failed, or did not leave exactly one new .om file."""
