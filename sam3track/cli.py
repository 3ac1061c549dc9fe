"""The ``sam3track`` command: track text prompts through a video, run the demo, inspect a bundle.

    sam3track track VIDEO --prompt TEXT --bundle DIR [-o OUT.mp4] ...
    sam3track batch INPUTS... --prompt TEXT --bundle DIR --out DIR ...
    sam3track demo; sam3track info BUNDLE
    sam3track serve [--bundle DIR] [--root DIR] [--host 127.0.0.1] [--port 8000]

This module parses the command line and dispatches; each subcommand lives in :mod:`sam3track.commands`.
Every option and the exit codes: docs/api.md, "Command line outputs".
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

import sam3track
from sam3track.commands import batch, demo, info, serve, track
from sam3track.commands.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, CliError
from sam3track.commands.demo import demo_clip
from sam3track.commands.track import run_track
from sam3track.jobs.geometric import BOX_FORM, POINT_FORM

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "CliError",
    "build_parser",
    "demo_clip",
    "main",
    "run_track",
]


class _OneLineErrors(argparse.ArgumentParser):
    """Usage mistakes reported like every other user error: one ``error:`` line, exit 2."""

    def error(self, message: str) -> NoReturn:
        for option, form, example in (("--point", POINT_FORM, "0:320,180"), ("--box", BOX_FORM, "0:10,20,200,180")):
            if message.startswith(f"argument {option}:"):
                message += f"; {option} takes {form}, e.g. {option} {example}"
        self.exit(EXIT_ERROR, f"error: {message} (see {self.prog} --help)\n")


def _join_dashed_values(argv: Sequence[str]) -> list[str]:
    """``--point -1:10,10`` as ``--point=-1:10,10``: argparse takes a value that starts with '-' for an
    option and says only "expected one argument"; joined, the value reaches its own check, which says
    what is wrong with it."""
    out: list[str] = []
    for token in argv:
        if out and out[-1] in ("--point", "--box") and token.startswith("-") and ":" in token:
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(
        prog="sam3track",
        description="SAM 3 video tracking from exported graphs (no PyTorch at run time).",
        epilog=(
            "examples:\n"
            "  sam3track demo                                   # the shipped random-weights bundle\n"
            "  python -m graphs.export --checkpoint SNAPSHOT --out sam3-bundle\n"
            "  sam3track track video.mp4 --prompt dog --bundle sam3-bundle --json dog.json\n"
            "  sam3track info sam3-bundle\n"
            "  sam3track serve --bundle sam3-bundle --root videos/  # a web page on 127.0.0.1:8000\n\n"
            "exit codes: 0 ok, 2 bad input, 130 Ctrl-C / 143 SIGTERM (the frames done are\n"
            "left beside the outputs as <stem>.interrupted<suffix>; complete outputs are kept)"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sam3track {sam3track.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for command in (track, batch, demo, info, serve):  # each command adds its own arguments
        command.add_parser(sub)
    return parser


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one ``warning:`` line: Python's default shows the source line that raised it
    (``warnings.warn(``), which tells a command-line user nothing."""
    stream = sys.stderr if file is None else file
    if stream is None:  # no stderr (pythonw, a detached service): nowhere to say it, as Python's own
        return
    try:
        print(f"warning: {message}", file=stream, flush=True)
    except (OSError, ValueError):  # a closed or broken pipe: a warning never stops the work
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sam3track`` command; returns the exit code."""
    with warnings.catch_warnings():
        warnings.showwarning = _warning_line
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = _join_dashed_values(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
        if args.command == "track" and not args.prompt and not args.geometric:
            args.usage_error("give at least one --prompt TEXT, --point FRAME:X,Y or --box FRAME:X0,Y0,X1,Y1")
    except SystemExit as e:  # --help, --version, or a usage error (argparse prints it)
        return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_ERROR)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
