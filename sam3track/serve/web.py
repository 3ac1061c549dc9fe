"""HTTP plumbing of ``sam3track serve``: who the client is, bodies read under a size cap, JSON errors,
and server-sent events."""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse

from sam3track.errors import shown

from .sessions import ServeError

CLIENT_HEADER = "X-Client-Id"
CLIENT_COOKIE = "sam3track_client"
_CLIENT_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")
MAX_JSON_BYTES = 1 << 20  # a request's fields: clicks and boxes, never megabytes
CHUNK = 1 << 16


def new_client_id() -> str:
    return secrets.token_urlsafe(18)


def client_of(request: Request) -> str:
    """The client id: the X-Client-Id header (curl, scripts) or the page's cookie."""
    value = request.headers.get(CLIENT_HEADER) or request.cookies.get(CLIENT_COOKIE)
    if value is None:
        raise ServeError(400, f"no client id: send the header {CLIENT_HEADER}: <8 to 64 letters, digits, '-' or "
                              "'_'> (sessions belong to it; the page sets a cookie instead)")
    if not _CLIENT_ID.fullmatch(value):
        raise ServeError(400, f"client id {shown(value)} must be 8 to 64 letters, digits, '-' or '_'")
    return value


def _declared_length(request: Request, limit: int, what: str) -> None:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise ServeError(413, f"{what} of {declared} bytes is over this server's limit of {limit} bytes")


async def json_body(request: Request) -> dict:
    """The request's JSON object (Content-Type application/json: a page elsewhere cannot send it without
    CORS, which is off)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise ServeError(415, f"send the request's fields as JSON with Content-Type: application/json, not "
                              f"{shown(kind) if kind else 'no Content-Type'}")
    _declared_length(request, MAX_JSON_BYTES, "a JSON request")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_JSON_BYTES:
            raise ServeError(413, f"a JSON request is over this server's limit of {MAX_JSON_BYTES} bytes")
    try:
        data = json.loads(body)
    except ValueError as e:
        raise ServeError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ServeError(400, f"the body must be a JSON object of the request's fields, not {type(data).__name__}")
    return data


async def receive_file(request: Request, path: Path, limit: int) -> int:
    """The raw body into ``path`` (a file of the server's own), refused past ``limit`` bytes."""
    what = "the upload"
    _declared_length(request, limit, what)
    size = 0
    with open(path, "wb") as file:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ServeError(413, f"{what} is over this server's limit of {limit} bytes (--max-upload-mb)")
            file.write(chunk)
    if size == 0:
        raise ServeError(400, "the upload is empty: send the video file as the request body")
    return size


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status)


def sse(data: dict, event: str | None = None) -> str:
    """One server-sent event."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n"


class HostCheck:
    """ASGI middleware: answer only requests whose Host header is one of ``hosts`` ("*": any). A server on
    the loopback must not answer a page elsewhere that reaches it under its own name (DNS rebinding)."""

    def __init__(self, app, hosts):
        self.app, self.hosts = app, set(hosts)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and "*" not in self.hosts:
            host = Headers(scope=scope).get("host", "")
            name = host if host.endswith("]") else host.rsplit(":", 1)[0]  # without the port
            if name not in self.hosts:
                response = error_response(400, f"Host {shown(host)} is not one this server answers "
                                               f"({', '.join(sorted(self.hosts))}); open it by one of those")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
