"""Build the SAM 3.1 reference environment: Meta's own predictor in a virtual environment of its own.

    python -m reference.sam31.build_env               # build (or find) it; prints its folder
    python -m reference.sam31.build_env --print-dir   # the folder it would use, built or not; builds nothing
    python -m reference.sam31.build_env --check       # exit 0 if it is built and complete, 1 if not

Meta's SAM 3.1 code (facebookresearch/sam3 @ 96914d2) is not on PyPI and pins numpy<2, while the project
runs numpy 2 and torch 2.13. So it never enters the project's environment: it gets a venv of its own and
the two sides talk through files (``graphs/sam31_reference.py`` runs the scripts beside this file there).

The environment lives in ``$SAM3TRACK_SAM31_REFERENCE_HOME/env-<key>/`` (default home
``~/.cache/sam3track/sam31-reference``). ``<key>`` hashes everything that decides its content: the
sha256 of Meta's source tarball, the pinned requirements (``requirements.lock``) and this file. (The
CPU shim and the scripts are not part of it: they change what runs in the env, not what is installed,
so they key the cached outputs instead, see ``graphs/sam31_reference.py``.) Layout::

    env-<key>/venv/          python3.11 -m venv, requirements.lock installed (exact versions)
    env-<key>/sam3-src/      Meta's tarball extracted unmodified (sam3/, LICENSE, ...); put on sys.path
    env-<key>/COMPLETE.json  written last: key, tarball sha256, pip freeze, build time

An env without ``COMPLETE.json`` is half-built: it is never used, and the next build wipes it. A second
build with the same key does nothing. This file uses the standard library only (it runs in any Python).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

TARBALL_NAME = "meta-sam3-96914d2.tar.gz"
# Meta's sam3 package at upstream commit 96914d2425f90a64f45ca977c2b5165418099543, as laid in
# shared/reference/sam3.1/. A different file is refused: every reference output depends on it.
TARBALL_SHA256 = "548f492ad8eb45165cd822b8fa8325d88936f35f32968faff8b37a19b5a458fd"
META_COMMIT = "96914d2425f90a64f45ca977c2b5165418099543"

REQUIREMENTS = HERE / "requirements.lock"
# Files whose content decides the environment (a change means a new key, so a fresh env).
ENV_SOURCES = (REQUIREMENTS, HERE / "build_env.py")

HOME_VAR = "SAM3TRACK_SAM31_REFERENCE_HOME"
TARBALL_VAR = "SAM3TRACK_SAM31_TARBALL"
PYTHON_VAR = "SAM3TRACK_SAM31_PYTHON"
MARKER = "COMPLETE.json"


class BuildError(RuntimeError):
    pass


def reference_home() -> Path:
    """Cache folder for the env and every output made in it."""
    env = os.environ.get(HOME_VAR)
    if env:
        return Path(env).expanduser().resolve()
    return Path.home() / ".cache" / "sam3track" / "sam31-reference"


def tarball_candidates() -> list[Path]:
    env = os.environ.get(TARBALL_VAR)
    if env:
        return [Path(env).expanduser()]
    # The project's shared/ folder lies beside the checkout (CI lays a copy beside its clone);
    # a checkout may also carry one inside it.
    return [REPO.parent / "shared" / "reference" / "sam3.1" / TARBALL_NAME,
            REPO / "shared" / "reference" / "sam3.1" / TARBALL_NAME]


def find_tarball() -> Path:
    for p in tarball_candidates():
        if p.is_file():
            return p
    tried = ", ".join(str(p) for p in tarball_candidates())
    raise BuildError(f"Meta's SAM 3.1 source tarball {TARBALL_NAME} not found (tried {tried}); "
                     f"set {TARBALL_VAR} to its path")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def env_key() -> str:
    """Hash of (tarball sha256, pinned requirements, harness sources): the env's folder name."""
    h = hashlib.sha256()
    h.update(TARBALL_SHA256.encode())
    for p in ENV_SOURCES:
        h.update(p.name.encode() + b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def env_dir() -> Path:
    return reference_home() / f"env-{env_key()}"


def is_complete(d: Path) -> bool:
    m = d / MARKER
    if not m.is_file():
        return False
    try:
        info = json.loads(m.read_text())
    except (OSError, ValueError):
        return False
    return info.get("key") == d.name[len("env-"):] and (d / "venv" / "bin" / "python").exists()


def find_env() -> Path | None:
    """The complete env for the current sources, or None."""
    d = env_dir()
    return d if is_complete(d) else None


def python_in(d: Path) -> Path:
    return d / "venv" / "bin" / "python"


def base_python() -> str:
    exe = os.environ.get(PYTHON_VAR) or shutil.which("python3.11")
    if not exe:
        raise BuildError(f"python3.11 not found on PATH (Meta's code and the pinned wheels need "
                         f"CPython 3.11); set {PYTHON_VAR} to one")
    out = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"],
                         capture_output=True, text=True)
    if out.returncode != 0 or out.stdout.strip() != "(3, 11)":
        raise BuildError(f"{exe} is not CPython 3.11 ({out.stdout.strip() or out.stderr.strip()})")
    return exe


@contextlib.contextmanager
def _lock(path: Path):
    """One builder at a time per key (a second waits, then finds the env complete)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd: list[str], log, **kw) -> str:
    log("+ " + " ".join(str(c) for c in cmd))
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        tail = (p.stdout[-4000:] + "\n" + p.stderr[-4000:]).strip()
        raise BuildError(f"command failed ({p.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return p.stdout


def _safe_extract(tar: tarfile.TarFile, dest: Path) -> None:
    dest = dest.resolve()
    for m in tar.getmembers():
        target = (dest / m.name).resolve()
        if dest not in target.parents and target != dest:
            raise BuildError(f"tarball member escapes the folder: {m.name}")
        if m.issym() or m.islnk():
            raise BuildError(f"tarball member is a link (refused): {m.name}")
    tar.extractall(dest)


def build(force: bool = False, log=print) -> Path:
    """Build the env for the current sources (no-op when complete); returns its folder."""
    d = env_dir()
    if is_complete(d) and not force:
        return d
    tarball = find_tarball()
    got = sha256_file(tarball)
    if got != TARBALL_SHA256:
        raise BuildError(f"{tarball} has sha256 {got}, expected {TARBALL_SHA256} (Meta's sam3 @ "
                         f"{META_COMMIT[:7]}); the reference is pinned to that source")
    py = base_python()
    with _lock(d.parent / f"env-{d.name[4:]}.lock"):
        if is_complete(d) and not force:
            return d
        t0 = time.time()
        if d.exists():
            log(f"removing incomplete env {d}")
            shutil.rmtree(d)
        d.mkdir(parents=True)
        _run([py, "-m", "venv", d / "venv"], log)
        vpy = python_in(d)
        # pip is configured machine-wide (find-links / local indexes with the torch 2.14.1 wheels and a
        # constraints file capping torch); every requirement is pinned exactly in requirements.lock.
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1")
        _run([vpy, "-m", "pip", "install", "--no-input", "-r", REQUIREMENTS], log, env=env)
        src = d / "sam3-src"
        src.mkdir()
        with tarfile.open(tarball) as tar:
            _safe_extract(tar, src)
        # Smoke test: Meta's package imports from the extracted source, numpy<2 and the pinned torch.
        _run([vpy, "-c",
              "import sys; sys.path.insert(0, sys.argv[1]); import numpy, torch, sam3, sam3.model_builder;"
              "assert numpy.__version__.startswith('1.'), numpy.__version__;"
              "print(torch.__version__, numpy.__version__, sam3.__file__)", src], log, env=env)
        freeze = _run([vpy, "-m", "pip", "freeze", "--all"], log, env=env).split()
        info = {
            "key": d.name[len("env-"):],
            "tarball": str(tarball),
            "tarball_sha256": TARBALL_SHA256,
            "meta_commit": META_COMMIT,
            "python": _run([vpy, "-c", "import sys; print(sys.version.split()[0])"], log).strip(),
            "pip_freeze": freeze,
            "build_s": round(time.time() - t0, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        tmp = d / (MARKER + ".partial")
        tmp.write_text(json.dumps(info, indent=1) + "\n")
        tmp.rename(d / MARKER)
        log(f"built {d} in {info['build_s']} s")
    return d


def du_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            fp = os.path.join(root, f)
            if not os.path.islink(fp):
                total += os.path.getsize(fp)
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reference.sam31.build_env", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--print-dir", action="store_true", help="print the env folder; build nothing")
    g.add_argument("--check", action="store_true", help="exit 0 when the env is complete, else 1")
    ap.add_argument("--force", action="store_true", help="rebuild even when complete")
    ap.add_argument("--prune", action="store_true",
                    help="after building, delete the home's other env-* folders (older keys, ~5 GB each)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.print_dir:
        print(env_dir())
        return 0
    if a.check:
        ok = find_env() is not None
        print(f"{env_dir()}: {'complete' if ok else 'not built'}")
        return 0 if ok else 1
    try:
        d = build(force=a.force, log=(lambda *_: None) if a.quiet else
                  (lambda m: print(m, file=sys.stderr, flush=True)))
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.prune:
        for other in sorted(reference_home().glob("env-*")):
            if other.is_dir() and other != d:
                print(f"pruning {other}", file=sys.stderr)
                shutil.rmtree(other)
    print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
