"""Exit codes and user errors, shared by every subcommand."""

from __future__ import annotations

import sys

from sam3track.errors import Sam3TrackError

EXIT_OK = 0
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C'd program


class CliError(Sam3TrackError):
    """A command-line argument is wrong (reported like every other user error)."""


def print_error(message: str) -> None:
    """Report a user error on stderr the way every subcommand does."""
    print(f"error: {message}", file=sys.stderr)
