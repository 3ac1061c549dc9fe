"""The Starlette app of ``sam3track serve``: the official request API as JSON, uploads, frames,
propagation as server-sent events, downloads, and the page (``static/``).

Routes and rules: docs/api.md, "The web server"; :class:`SessionRegistry` holds the sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from pathlib import Path

import anyio
import cv2
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import sam3track
from sam3track.compat import REQUEST_FIELDS, STREAM_REQUEST_FIELDS, OfficialPredictor
from sam3track.errors import Sam3TrackError, shown
from sam3track.render import PALETTE

from .downloads import DOWNLOADS, write_download
from .paths import VIDEO_SUFFIXES, VideoRoot
from .sessions import Limits, ServedSession, ServeError, SessionRegistry, closed_error
from .web import CLIENT_COOKIE, HostCheck, client_of, error_response, json_body, new_client_id, receive_file, sse

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
REQUEST_TYPES = (*REQUEST_FIELDS, *STREAM_REQUEST_FIELDS)
JPEG_QUALITY = 90


def run(function, *args):
    """``function(*args)`` on a worker thread: model calls and decoding never block the event loop."""
    return anyio.to_thread.run_sync(lambda: function(*args))


class ServeApi:
    """The routes, over one registry of sessions, one video root and one folder of the server's files."""

    def __init__(self, registry: SessionRegistry, root: VideoRoot, bundle_name: str):
        self.registry, self.root, self.limits, self.bundle_name = registry, root, registry.limits, bundle_name
        self.workdir = Path(tempfile.mkdtemp(prefix="sam3track-serve-"))  # uploads, downloads: nothing else

    # ---------------------------------------------------------------------------------- page
    async def index(self, request: Request) -> Response:
        response = FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})
        if request.cookies.get(CLIENT_COOKIE) is None:  # the page's client id: same-site requests only
            response.set_cookie(CLIENT_COOKIE, new_client_id(), httponly=True, samesite="strict")
        return response

    async def info(self, request: Request) -> Response:
        return JSONResponse({
            "version": sam3track.__version__, "bundle": self.bundle_name, "limits": self.limits.as_dict(),
            "root": self.root.root is not None, "request_types": list(REQUEST_TYPES),
            "palette": PALETTE.tolist(), "video_suffixes": list(VIDEO_SUFFIXES),
            "sessions_open": self.registry.count(),
        })

    async def videos(self, request: Request) -> Response:
        return JSONResponse({"videos": await run(self.root.videos)})

    # ----------------------------------------------------------------------- request API
    async def request_api(self, request: Request) -> Response:
        """POST /api/request (the request's "type" in the body) or /api/<type>."""
        kind = request.path_params.get("kind")
        if kind is not None and kind not in REQUEST_TYPES:
            raise ServeError(404, f"no route {request.method} /api/{kind}; the request types (POST /api/<type>) "
                                  f"are {', '.join(REQUEST_TYPES)}")
        if request.method != "POST":
            raise ServeError(405, f"{request.method} is not allowed on {request.url.path}: POST the request's "
                                  "fields as JSON")
        client = client_of(request)
        body = await json_body(request)
        if kind is not None and body.setdefault("type", kind) != kind:
            raise ServeError(400, f"the body's type {shown(body['type'])} differs from the route's {kind!r}")
        if body.get("type") not in REQUEST_TYPES:
            raise ServeError(400, f"invalid request type: {shown(body.get('type'))} (one of: "
                                  f"{', '.join(REQUEST_TYPES)})")
        if body["type"] == "start_session":
            return JSONResponse(await self._start_session(client, body))
        if body["type"] == "propagate_in_video":
            return await self._propagate(client, body)
        return JSONResponse(await run(self.registry.handle, client, body))

    async def _start_session(self, client: str, body: dict) -> dict:
        unknown = sorted(set(body) - REQUEST_FIELDS["start_session"] - {"type"})
        if unknown:
            raise ServeError(400, f"start_session request has unknown field(s) {', '.join(map(repr, unknown))}")
        if body.get("session_id") is not None:
            raise ServeError(400, "start_session: the server names sessions (ids no other client can guess); "
                                  "leave session_id out")
        if "resource_path" not in body:
            raise ServeError(400, "start_session request needs the field 'resource_path' (a video under the "
                                  "server's --root), or upload the video with POST /api/upload")
        path = self.root.resolve(body["resource_path"])
        entry = await run(self.registry.start, client, path, body["resource_path"])
        return entry.info()

    async def upload(self, request: Request) -> Response:
        """POST /api/upload?filename=NAME with the video as the raw body: a new session on it."""
        client = client_of(request)
        name = Path(request.query_params.get("filename") or "upload.mp4").name
        suffix = Path(name).suffix.lower()
        if suffix not in VIDEO_SUFFIXES:
            raise ServeError(400, f"upload {shown(name)}: the file name must end in one of "
                                  f"{', '.join(VIDEO_SUFFIXES)} (?filename=clip.mp4)")
        self.registry.check_room(client)  # refused before the body is read
        folder = Path(tempfile.mkdtemp(prefix="upload-", dir=self.workdir))
        try:
            await receive_file(request, folder / f"video{suffix}", self.limits.max_upload_bytes)
            entry = await run(self.registry.start, client, folder / f"video{suffix}", name, folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return JSONResponse(entry.info())

    async def _propagate(self, client: str, body: dict) -> Response:
        """propagate_in_video as server-sent events: "start" (frames to come), one unnamed event per
        frame, then "done" (or "error"). Checked before the first byte: a bad request is a 4xx."""
        entry, stream, total = await run(self.registry.open_stream, client, body)
        return StreamingResponse(self._frames(entry, stream, total), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def _frames(self, entry: ServedSession, stream, total: int):
        done = 0
        try:
            yield sse({"session_id": entry.id, "total": total}, "start")
            while (response := await run(self.registry.next_frame, entry, stream)) is not None:
                done += 1
                yield sse({**response, "done": done, "total": total})
            yield sse({"frames": done}, "done")
        except Sam3TrackError as e:
            yield sse({"error": str(e), "frames": done}, "error")
        except Exception:
            log.exception("propagation of session %s failed", entry.id)
            yield sse({"error": "internal error while tracking; the server log has the details",
                       "frames": done}, "error")
        finally:
            with anyio.CancelScope(shield=True):  # a client gone mid-stream still ends it
                await run(self.registry.end_stream, entry, stream)

    # ------------------------------------------------------------------------ a session's data
    async def sessions(self, request: Request) -> Response:
        client = client_of(request)
        return JSONResponse({"sessions": [e.info() for e in self.registry.sessions_of(client)]})

    async def session_info(self, request: Request) -> Response:
        return JSONResponse(self._entry(request).info())

    async def frame(self, request: Request) -> Response:
        """GET /api/sessions/{id}/frames/{index}: the frame as JPEG."""
        entry = self._entry(request)
        index = request.path_params["index"]
        data = await run(self._jpeg, entry, index)
        return Response(data, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=3600"})

    def _jpeg(self, entry: ServedSession, index: int) -> bytes:
        with entry.lock:
            if entry.closed:
                raise closed_error(entry)
            n = entry.session.num_frames
            if not 0 <= index < n:
                raise ServeError(404, f"frame {index} is out of range: the video has {n} frames (0..{n - 1})")
            rgb = entry.session.frame(index)
        ok, data = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        return data.tobytes()

    async def outputs(self, request: Request) -> Response:
        """GET /api/sessions/{id}/outputs/{index}: that frame's latest outputs (404 if none)."""
        entry = self._entry(request)
        index = request.path_params["index"]
        outputs = entry.results.get(index)
        if outputs is None:
            raise ServeError(404, f"frame {index} has no outputs yet; add a prompt on it or propagate")
        return JSONResponse({"frame_index": index, "outputs": outputs})

    async def download(self, request: Request) -> Response:
        """GET /api/sessions/{id}/download/{masks.mp4|results.json|masks.zip}."""
        entry = self._entry(request)
        kind = request.path_params["kind"]
        if kind not in DOWNLOADS:
            raise ServeError(404, f"no download {shown(kind)}; one of: {', '.join(DOWNLOADS)}")
        outputs = dict(entry.results)  # one copy under the GIL: never wait on the session from the event loop
        if not outputs:
            raise ServeError(409, "no frame has outputs yet: add a prompt and propagate first")
        folder = Path(tempfile.mkdtemp(prefix="download-", dir=self.workdir))
        try:
            path = await run(write_download, kind, entry.video, entry.name, outputs, folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        stem = Path(entry.name).stem or "video"
        return FileResponse(path, media_type=DOWNLOADS[kind], filename=f"{stem}.{kind}",
                            background=BackgroundTask(shutil.rmtree, folder, ignore_errors=True))

    def _entry(self, request: Request) -> ServedSession:
        return self.registry.get(client_of(request), request.path_params["session_id"])

    # ------------------------------------------------------------------------------ lifecycle
    async def expire_idle_sessions(self) -> None:
        """Every few seconds, close the sessions unused for idle_seconds."""
        period = min(max(self.limits.idle_seconds / 4, 0.5), 30.0)
        while True:
            await asyncio.sleep(period)
            for session_id in await run(self.registry.expire_idle):
                log.info("closed session %s: unused for %g s", session_id, self.limits.idle_seconds)

    def shutdown(self) -> None:
        self.registry.close_all()
        shutil.rmtree(self.workdir, ignore_errors=True)


def routes(api: ServeApi) -> list:
    session = "/api/sessions/{session_id:str}"
    return [
        Route("/", api.index),
        Route("/api/info", api.info),
        Route("/api/videos", api.videos),
        Route("/api/request", api.request_api, methods=["POST"]),
        Route("/api/upload", api.upload, methods=["POST"]),
        Route("/api/sessions", api.sessions),
        Route(session, api.session_info),
        Route(session + "/frames/{index:int}", api.frame),
        Route(session + "/outputs/{index:int}", api.outputs),
        Route(session + "/download/{kind:str}", api.download),
        Route("/api/{kind:str}", api.request_api, methods=["GET", "POST"]),  # GET: a 404 or 405 that says why
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]


async def _serve_error(request: Request, exc: ServeError) -> Response:
    return error_response(exc.status, str(exc))


async def _user_error(request: Request, exc: Sam3TrackError) -> Response:
    # the request API's errors (RequestError), the session's (a prompt, a frame, an object id)
    return error_response(400, str(exc))


async def _http_error(request: Request, exc: HTTPException) -> Response:
    message = {404: f"no such page or route: {request.method} {request.url.path} (docs/api.md lists them)",
               405: f"{request.method} is not allowed on {request.url.path} (the request API takes POST; "
                    "docs/api.md lists the routes)"}.get(exc.status_code, str(exc.detail))
    return error_response(exc.status_code, message)


async def _internal_error(request: Request, exc: Exception) -> Response:
    # Starlette logs the traceback on the server's console; the client gets one line
    return error_response(500, f"internal error ({type(exc).__name__}); the server's log has the details")


def create_app(predictor, *, root=None, limits: Limits | None = None, allowed_hosts=LOOPBACK_HOSTS,
               cors_origins=(), bundle_name: str = "") -> Starlette:
    """The app over a loaded :class:`~sam3track.predictor.Predictor` (left open: the caller closes it).

    ``root``: the folder whose videos clients may open by path (None: uploads only). ``allowed_hosts``:
    the Host headers answered (the loopback names by default, against DNS rebinding; ``("*",)`` for any).
    ``cors_origins``: origins whose pages may call the API (none by default)."""
    limits = limits or Limits()
    api = ServeApi(SessionRegistry(OfficialPredictor(predictor), limits), VideoRoot(root), bundle_name)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        reaper = asyncio.create_task(api.expire_idle_sessions())
        try:
            yield
        finally:
            reaper.cancel()
            await run(api.shutdown)

    middleware = [Middleware(HostCheck, hosts=allowed_hosts)]
    if cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                                     allow_headers=["Content-Type", "X-Client-Id"]))
    app = Starlette(routes=routes(api), middleware=middleware, lifespan=lifespan, exception_handlers={
        ServeError: _serve_error, Sam3TrackError: _user_error, HTTPException: _http_error,
        Exception: _internal_error})
    app.state.api = api
    return app
