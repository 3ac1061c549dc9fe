"""``sam3track serve``: a local web page and JSON API to prompt, click and track on a video
(:mod:`sam3track.serve`; needs the ``serve`` extra)."""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from pathlib import Path

from sam3track.commands.common import EXIT_ERROR, EXIT_OK, int_at_least, print_error, setting
from sam3track.commands.demo import DEMO_OVERRIDES, RANDOM_WEIGHTS_NOTE
from sam3track.errors import Sam3TrackError

MISSING_EXTRA = "sam3track serve needs the serve extra: pip install 'sam3track[serve]'"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the URL is printed (port 0 picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise Sam3TrackError(f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _limits(args: argparse.Namespace):
    from sam3track.serve.sessions import Limits

    return Limits(max_sessions=args.max_sessions, max_client_sessions=args.max_client_sessions,
                  max_upload_bytes=args.max_upload_mb * 2**20, max_frames=args.max_frames,
                  max_objects=args.max_objects, idle_seconds=float(args.idle_timeout))


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from sam3track.serve import create_app
        from sam3track.serve.app import LOOPBACK_HOSTS
    except ImportError as e:
        print_error(f"{MISSING_EXTRA} ({e})")
        return EXIT_ERROR
    if args.root is not None and not args.root.is_dir():
        print_error(f"--root {args.root} is not a folder; name the folder whose videos the page may open")
        return EXIT_ERROR
    try:
        sock = _bind(args.host, args.port)  # a taken port fails before the bundle loads
    except Sam3TrackError as e:
        print_error(str(e))
        return EXIT_ERROR
    try:
        predictor, name = _load(args)
    except Sam3TrackError as e:
        sock.close()
        print_error(str(e))
        return EXIT_ERROR
    # on loopback, answer the names of this machine (and the address bound, e.g. 127.0.0.2) only
    hosts = (*LOOPBACK_HOSTS, args.host) if _is_loopback(args.host) else ("*",)
    app = create_app(predictor, root=args.root, limits=_limits(args), cors_origins=args.cors_origin,
                     bundle_name=name, allowed_hosts=hosts)
    port = sock.getsockname()[1]
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"sam3track serve: http://{shown_host}:{port}/ (Ctrl-C stops)", flush=True)
    try:
        uvicorn.Server(uvicorn.Config(app, log_level=args.log_level)).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shuts down on Ctrl-C, then raises it again: the normal way to stop
        print("sam3track serve: stopped", flush=True)
    finally:
        sock.close()
        predictor.close()
    return EXIT_OK


def _load(args: argparse.Namespace):
    import sam3track

    options = dict(args.set or [])
    options["max_num_objects"] = args.max_objects
    if args.threads is not None:
        options["threads"] = args.threads
    if args.bundle is None:
        from sam3track.demo import demo_bundle_path

        print(RANDOM_WEIGHTS_NOTE, file=sys.stderr, flush=True)
        bundle = demo_bundle_path()
        options = {**DEMO_OVERRIDES, **options}
    else:
        bundle = args.bundle
    return sam3track.load(bundle, backend=args.backend, device=args.device, **options), Path(bundle).name


def add_parser(sub) -> argparse.ArgumentParser:
    """``sam3track serve`` and its arguments, on the CLI's subparsers."""
    serve = sub.add_parser(
        "serve",
        help="a local web page (and JSON API) to prompt, click and track on a video",
        description=(
            "Starts a local HTTP server with a page to open a video (upload, or pick one under --root), "
            "type text prompts, click and draw boxes, propagate with live progress, and download the mask "
            "video, JSON (RLE) and PNGs; its JSON API mirrors the official request API (docs/api.md). "
            "Listens on 127.0.0.1 unless --host says otherwise. Needs pip install 'sam3track[serve]'."
        ),
    )
    serve.add_argument("--bundle", "-b", type=Path, default=None, metavar="DIR",
                       help="exported bundle (default: the shipped demo bundle, RANDOM weights)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this "
                       "machine only)")
    serve.add_argument("--port", type=int_at_least(0), default=8000, help="port (default 8000; 0: a free one)")
    serve.add_argument("--root", type=Path, default=None, metavar="DIR",
                       help="folder whose videos the page may open by path (nothing outside it; default: "
                            "uploads only)")
    _add_limits(serve)
    serve.add_argument("--backend", default="auto", metavar="NAME", help="inference backend (default "
                       "auto: the fastest path within the parity tolerances here, measured once and cached)")
    serve.add_argument("--device", default="cpu", metavar="NAME", help="device for the backend (default cpu)")
    serve.add_argument("--threads", type=int_at_least(1), default=None, metavar="N",
                       help="intra-op threads for the backend (default: the backend's own)")
    serve.add_argument("--set", type=setting, action="append", default=[], metavar="NAME=VALUE",
                       help="override a setting of the bundle's configuration; repeatable")
    serve.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                       help="the server's log level (default warning)")
    serve.set_defaults(func=cmd_serve)
    return serve


def _add_limits(serve: argparse.ArgumentParser) -> None:
    """Caps that keep one client from taking the server (each refusal is a 4xx naming the option)."""
    serve.add_argument("--max-sessions", type=int_at_least(1), default=8, metavar="N",
                       help="open sessions, all clients together (default 8)")
    serve.add_argument("--max-client-sessions", type=int_at_least(1), default=4, metavar="N",
                       help="open sessions of one client (default 4)")
    serve.add_argument("--max-upload-mb", type=int_at_least(1), default=512, metavar="MB",
                       help="largest upload (default 512)")
    serve.add_argument("--max-frames", type=int_at_least(1), default=10_000, metavar="N",
                       help="frames of one video (default 10000)")
    serve.add_argument("--max-objects", type=int_at_least(1), default=16, metavar="N",
                       help="objects tracked at once in one session (default 16)")
    serve.add_argument("--idle-timeout", type=int_at_least(1), default=600, metavar="SECONDS",
                       help="close a session unused this long, freeing its memory and upload (default 600)")
    serve.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                       help="let pages from ORIGIN call the API (default: none, CORS off); repeatable")
