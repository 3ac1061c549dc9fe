"""Exit codes and user errors, shared by every subcommand."""

from __future__ import annotations

import argparse
import json
import sys

from sam3track.errors import UsageError
from sam3track.jobs.exit_codes import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "CliError", "Paragraphs", "int_at_least", "print_error",
           "setting"]

# A command-line argument is wrong: the library's UsageError, under the name the CLI has always used.
CliError = UsageError


def print_error(message: str) -> None:
    """Report a user error on stderr the way every subcommand does."""
    print(f"error: {message}", file=sys.stderr)


def int_at_least(minimum: int):
    """An argparse type: a whole number >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    return parse


def setting(text: str) -> tuple[str, object]:
    """An argparse type: NAME=VALUE with VALUE read as JSON when it parses (numbers, true/false), else
    as text."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name.strip(), json.loads(value)
    except ValueError:
        return name.strip(), value


class Paragraphs(argparse.HelpFormatter):
    """Wraps a description like the default formatter, keeping its paragraphs (marked by NUL)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(super(Paragraphs, self)._fill_text(part, width, indent)
                            for part in text.split("\0"))
