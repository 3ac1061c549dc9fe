"""The settings Meta's SAM 3.1 builder gives its predictor, as built (reference env).

    <env>/venv/bin/python reference/sam31/builder_config.py --out OUT.json

Builds the predictor with Meta's ``build_sam3_predictor(version="sam3.1")`` (the small sizes of
shim.SMALL, seeded weights: settings do not depend on sizes or weights) and writes every plain
attribute (numbers, booleans, strings, None, tuples and lists of those) of three objects:
``predictor`` (Sam3MultiplexVideoPredictor), ``model`` (its Sam3MultiplexTrackingWithInteractivity:
detection, association and hotstart heuristics) and ``tracker`` (model.tracker.model: the multiplex
video tracker's memory and multimask settings). graphs/sam31/export.py records the ones a runtime
needs in the bundle's manifest; a test compares them with this file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import shim  # noqa: E402  (puts Meta's source on sys.path)

import common  # noqa: E402

_PLAIN = (bool, int, float, str, type(None))


def plain_attributes(obj) -> dict:
    out = {}
    for k, v in sorted(vars(obj).items()):
        if k.startswith("_"):
            continue
        if isinstance(v, _PLAIN):
            out[k] = v
        elif isinstance(v, (tuple, list)) and all(isinstance(x, _PLAIN) for x in v):
            out[k] = list(v)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    common.setup_threads(1)
    pred = shim.build_predictor(config=dict(shim.SMALL))
    m = pred.model
    common.write_json(a.out, {"config": dict(shim.SMALL), "predictor": plain_attributes(pred),
                              "model": plain_attributes(m), "tracker": plain_attributes(m.tracker.model)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
