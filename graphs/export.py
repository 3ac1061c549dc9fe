"""Export a checkpoint of either family into a sam3track bundle (the command line; each family's export
is graphs/<family>/export.py).

    python -m graphs.export --checkpoint DIR --out BUNDLE [--fp16 GRAPH ...] [--int8 GRAPH ...] [--attention plain]
    python -m graphs.export --tiny [--seed N] --out BUNDLE       # = --preset tiny
    python -m graphs.export --preset mid --out BUNDLE             # the benchmarks' model (real widths)
    python -m graphs.export --preset small --out BUNDLE           # SAM 3 at the SAM 3.1 small config
    python -m graphs.export --demo --out sam3track/demo_bundle --overwrite   # the shipped demo bundle
    python -m graphs.export --family sam3.1 --checkpoint sam3.1_multiplex.pt --out BUNDLE   # Meta's SAM 3.1
    python -m graphs.export --family sam3.1 --tiny --out BUNDLE   # the SAM 3.1 reference harness's seeded model

The bundle is built in a temporary sibling directory and renamed into place only when complete, so an
interrupted or failed export never leaves something that looks like a bundle.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .onnx_export import CheckpointError, ExportError, command
from .sam3.export import GRAPHS, export_bundle  # noqa: F401  (export_bundle: SAM 3's, at its old path too)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphs.export", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=Path, help="local Hugging Face snapshot of facebook/sam3")
    source.add_argument("--tiny", action="store_true", help="the small deterministic seeded test model")
    source.add_argument("--demo", action="store_true",
                        help="the smaller seeded model of the shipped demo bundle, without its checkpoint "
                             "(regenerate it with --out sam3track/demo_bundle --overwrite)")
    source.add_argument("--preset", choices=("tiny", "demo", "mid", "small"),
                        help="a seeded model by name: tiny (= --tiny), demo (= --demo), mid (the benchmarks' "
                             "model with the real widths at 504 px) or small (SAM 3 at the SAM 3.1 reference's "
                             "small config, 448 px; graphs/sam3/tiny.py)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the seeded model's weights")
    parser.add_argument("--out", type=Path, required=True, help="bundle directory to create")
    parser.add_argument("--fp16", nargs="+", default=[], metavar="GRAPH",
                        help=f"graphs to store in fp16 ({', '.join(GRAPHS)} or 'all'; 'all' keeps the text "
                             "encoder in fp32, whose fp16 numerics are risky on Ascend: name it to include it)")
    parser.add_argument("--int8", nargs="+", default=[], metavar="GRAPH",
                        help="graphs to quantise to int8 weights (ONNX Runtime dynamic quantisation; CPU fast path "
                             "with a fidelity cost: see the README's benchmark table), e.g. --int8 backbone")
    parser.add_argument("--attention", choices=("fused", "plain"), default="fused",
                        help="memory attention as ONNX Runtime's fused MultiHeadAttention op (default: fast, no "
                             "[objects, HW, memories*HW] score tensor) or plain standard ops (for om.convert: ATC "
                             "rejects custom-domain ops)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing bundle at --out")
    parser.add_argument("--family", choices=("sam3", "sam3.1"), default="sam3",
                        help="model family: sam3 (default; a Hugging Face facebook/sam3 snapshot) or sam3.1 (Meta's "
                             "sam3.1_multiplex.pt, or with --tiny the SAM 3.1 reference harness's seeded model)")
    parser.add_argument("--bpe", type=Path, help="--family sam3.1: Meta's tokenizer vocab "
                        "(bpe_simple_vocab_16e6.txt.gz) when it is not beside the checkpoint")
    args = parser.parse_args(argv)
    if args.family == "sam3.1":
        return _main_sam31(parser, args)
    if args.bpe is not None:
        parser.error("--bpe is for --family sam3.1 (SAM 3 snapshots carry their tokenizer)")
    fp16 = tuple(g for g in GRAPHS if g != "text_encoder") if "all" in args.fp16 else tuple(args.fp16)
    if "all" in args.fp16 and "text_encoder" in args.fp16:
        fp16 += ("text_encoder",)
    preset = args.preset or ("demo" if args.demo else "tiny" if args.tiny else None)
    try:
        export_bundle(args.checkpoint, args.out, fp16=fp16, overwrite=args.overwrite,
                      tiny_seed=args.seed if preset else None,
                      tiny_preset=preset or "tiny", keep_source=preset != "demo", attention=args.attention,
                      int8=tuple(args.int8))
    except (CheckpointError, ExportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _main_sam31(parser, args) -> int:
    from .sam31 import export as sam31_export

    if args.demo or args.preset not in (None, "tiny"):
        parser.error("--family sam3.1 exports --checkpoint FILE or --tiny (no --demo or --preset models)")
    if args.seed != 0:
        parser.error("--family sam3.1 --tiny is the reference harness's checkpoint, seeded 0 (no --seed)")
    fp16 = tuple(g for g in sam31_export.detector.GRAPHS if g != "text_encoder") if "all" in args.fp16 \
        else tuple(args.fp16)
    try:
        sam31_export.export_bundle(args.checkpoint, args.out, overwrite=args.overwrite,
                                   tiny=bool(args.tiny or args.preset), attention=args.attention, bpe=args.bpe,
                                   fp16=fp16, int8=tuple(args.int8))
    except (CheckpointError, ExportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


main = command(_main)

if __name__ == "__main__":
    sys.exit(main())
