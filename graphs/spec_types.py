"""The description of one exported graph's inputs and outputs (names, dtypes, symbolic shapes), shared by
every family's spec table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple  # ints and symbolic names (str)


@dataclass(frozen=True)
class GraphSpec:
    name: str
    module: type
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        axes = {}
        for t in self.inputs + self.outputs:
            dims = {i: d for i, d in enumerate(t.shape) if isinstance(d, str)}
            if dims:
                axes[t.name] = dims
        return axes
