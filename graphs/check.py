"""Check every graph of a bundle in onnxruntime against the code it replaces (the command line; each
family's checks are graphs/<family>/check.py, chosen by the manifest's family).

    python -m graphs.check BUNDLE [--checkpoint DIR] [--graphs NAME ...]

Prints max absolute and relative error per output and exits non-zero when any output is over tolerance
(graphs/comparison.py: the rules and tolerances).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .comparison import CheckError
from .onnx_export import command


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphs.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--checkpoint", type=Path, help="the checkpoint the bundle was exported from "
                        "(default: the path recorded in the manifest)")
    parser.add_argument("--graphs", nargs="+", help="check only these graphs")
    args = parser.parse_args(argv)
    if not (args.bundle / "manifest.json").is_file():
        print(f"error: {args.bundle} has no manifest.json; export a bundle first (python -m graphs.export)",
              file=sys.stderr)
        return 2
    try:
        family = json.loads((args.bundle / "manifest.json").read_text()).get("family", "sam3")
        if family == "sam3.1":  # Meta's SAM 3.1: its graphs and references are another package's
            from .sam31.check import run_checks as run_family_checks
        else:
            from .sam3.check import run_checks as run_family_checks
        rows = run_family_checks(args.bundle, args.checkpoint, args.graphs)
    except CheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bad = [r for r in rows if not r.ok]
    print(f"{len(rows) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


main = command(_main)

if __name__ == "__main__":
    sys.exit(main())
