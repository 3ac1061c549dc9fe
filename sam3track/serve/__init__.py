"""``sam3track serve``: a local web page and JSON API to prompt, click and track on a video.

:func:`create_app` builds the Starlette app (needs the ``serve`` extra: ``pip install 'sam3track[serve]'``);
the routes, the request format and the safety rules are in docs/api.md, "The web server".
"""

from __future__ import annotations

__all__ = ["Limits", "create_app"]


def __getattr__(name: str):
    # Starlette is imported only when the app is built: the limits and paths need no extra.
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "Limits":
        from .sessions import Limits

        return Limits
    raise AttributeError(f"module 'sam3track.serve' has no attribute {name!r}")
