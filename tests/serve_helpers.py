"""Servers for the ``sam3track serve`` tests: the app in a uvicorn thread on a free loopback port (one per
test module), or the real command line in a child process; every wait is bounded and fails naming the hang."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn

REPO = Path(__file__).resolve().parents[1]
CLIPS = REPO / "examples" / "clips"
CARPHONE = CLIPS / "carphone_pristine.mp4"  # 120 frames of 176 x 144: the cheapest real clip
CHROMIUM = Path("/usr/bin/chromium")  # Debian's package; .ci/run installs it
# Flags for a headless Chromium that touches nothing outside this machine.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
START_SECONDS = 120  # a server that has not answered by then hangs (it takes about 2 s)


class ServerThread:
    """``app`` served by uvicorn on 127.0.0.1:<free port> in a thread, for a ``with`` block."""

    def __init__(self, app):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + START_SECONDS
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                pytest.fail(f"the serve app did not start within {START_SECONDS} s (a hang, or it failed: see "
                            "the captured log)", pytrace=False)
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(START_SECONDS)
        self.sock.close()
        if self.thread.is_alive():
            pytest.fail(f"the serve app did not stop within {START_SECONDS} s of being told to", pytrace=False)


def start_cli_server(*args: str) -> tuple[subprocess.Popen, str]:
    """``python -m sam3track serve --port 0 ARGS`` and the URL it prints."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "sam3track", "serve", "--port", "0", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        line = lines.get(timeout=START_SECONDS)
    except queue.Empty:
        proc.kill()
        pytest.fail(f"sam3track serve printed no URL within {START_SECONDS} s (stderr: "
                    f"{proc.stderr.read()[-2000:]})", pytrace=False)
    if "http://" not in line:
        proc.kill()
        pytest.fail(f"sam3track serve printed {line!r}, not its URL (stderr: {proc.stderr.read()[-2000:]})",
                    pytrace=False)
    return proc, line.split()[2].rstrip("/")


def stop_cli_server(proc: subprocess.Popen) -> tuple[int, str]:
    """Ctrl-C, as a user stops it: its exit code and stderr."""
    proc.send_signal(2)
    try:
        _, err = proc.communicate(timeout=START_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"sam3track serve did not stop within {START_SECONDS} s of Ctrl-C", pytrace=False)
    return proc.returncode, err


def sse_events(text: str) -> list[tuple[str, dict]]:
    """(event, data) of each server-sent event in a response body."""
    events = []
    for block in text.strip().split("\n\n"):
        event, data = "message", ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: "):
                data += line[len("data: "):]
        events.append((event, json.loads(data)))
    return events
