"""Meta's SAM 3.1 predictor as a reference, seen from the project's environment (no Meta imports).

Finds Meta's virtual environment (``python -m reference.sam31.build_env``), runs the scripts of
``reference/sam31/`` in it as subprocesses and caches what they write, keyed by everything that
decides it.

    python -m graphs.sam31.reference [--modules]    # make (or find) the cached outputs

The API (``reference()``, ``load_scenario``): docs/sam31.md, "Checks and the reference"; the cache's
layout and keys: reference/sam31/README.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
REF_DIR = REPO / "reference" / "sam31"
SCRIPTS = {"checkpoint": "make_checkpoint.py", "scenarios": "run_scenarios.py", "modules": "dump_modules.py"}
HARNESS = ("shim.py", "common.py", "driver.py")
REQUIRE_VAR = "SAM3TRACK_REQUIRE_SAM31_REFERENCE"
BUILD_COMMAND = "python -m reference.sam31.build_env"
OFFICIAL_KEYS = ("out_obj_ids", "out_probs", "out_boxes_xywh", "out_binary_masks")


class ReferenceError(RuntimeError):
    pass


def _build_env():
    """reference/sam31/build_env.py (stdlib only), loaded by path: reference/ is not installed."""
    mod = sys.modules.get("_sam31_build_env")
    if mod is None:
        path = REF_DIR / "build_env.py"
        if not path.is_file():
            raise ReferenceError(f"{path} not found: graphs.sam31.reference needs the repository checkout")
        spec = importlib.util.spec_from_file_location("_sam31_build_env", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_sam31_build_env"] = mod
        spec.loader.exec_module(mod)
    return mod


def reference_home() -> Path:
    return _build_env().reference_home()


def expected_env_dir() -> Path:
    return _build_env().env_dir()


def find_env() -> Path | None:
    """The complete reference env for the current sources, or None when it is not built."""
    try:
        return _build_env().find_env()
    except OSError:
        return None


def missing_reason() -> str:
    return (f"the SAM 3.1 reference environment is not built at {expected_env_dir()}; build it with "
            f"`{BUILD_COMMAND}` (5.7 GB, about 70 s here; needs python3.11 and Meta's tarball from "
            f"shared/reference/sam3.1/)")


def _sha_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def outputs_key(kind: str, args: dict, depends: str = "") -> str:
    be = _build_env()
    h = hashlib.sha256()
    h.update(be.TARBALL_SHA256.encode())
    h.update(be.env_key().encode())
    for name in (SCRIPTS[kind],) + HARNESS:
        h.update(name.encode() + b"\0" + _sha_file(REF_DIR / name).encode())
    h.update(json.dumps(args, sort_keys=True).encode())
    h.update(depends.encode())
    return h.hexdigest()[:16]


def run_script(env: Path, script: str, args: list[str], timeout: float | None = None,
               log=None) -> subprocess.CompletedProcess:
    """Run reference/sam31/<script> with the env's python; raises ReferenceError on failure."""
    py = env / "venv" / "bin" / "python"
    cmd = [str(py), str(REF_DIR / script), *map(str, args)]
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    environ["PYTHONNOUSERSITE"] = "1"
    t = time.time()
    p = subprocess.run(cmd, cwd=REPO, env=environ, capture_output=True, text=True, timeout=timeout)
    if log:
        log(f"{script}: {time.time() - t:.1f} s")
    if p.returncode != 0:
        tail = (p.stdout[-3000:] + "\n" + p.stderr[-6000:]).strip()
        raise ReferenceError(f"{' '.join(cmd)} failed ({p.returncode}):\n{tail}")
    return p


def _cached(env: Path, kind: str, args: dict, cli: list[str], depends: str = "",
            timeout: float | None = None) -> Path:
    import fcntl

    key = outputs_key(kind, args, depends)
    out = reference_home() / "outputs" / f"{kind}-{key}"
    done = out / "DONE.json"
    if done.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{kind}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file():
            return out
        tmp = out.with_name(out.name + ".partial")
        if tmp.exists():
            shutil.rmtree(tmp)
        if out.exists():
            shutil.rmtree(out)
        t = time.time()
        p = run_script(env, SCRIPTS[kind], [*cli, "--out", tmp], timeout=timeout)
        (tmp / "run.log").write_text(p.stdout + "\n--- stderr ---\n" + p.stderr[-20000:])
        (tmp / "DONE.json").write_text(json.dumps(
            {"kind": kind, "key": key, "args": args, "seconds": round(time.time() - t, 1),
             "env": str(env)}, indent=1) + "\n")
        tmp.rename(out)
    return out


@dataclasses.dataclass
class Reference:
    env: Path
    checkpoint_dir: Path
    scenarios: Path

    @property
    def checkpoint(self) -> Path:
        return self.checkpoint_dir / "sam3.1_multiplex.pt"

    def modules(self) -> Path:
        return module_dumps(self.env, self.checkpoint_dir)

    def confident(self) -> tuple[Path, Path]:
        """The confident checkpoint's folder and its scenarios (the reconditioning ones), on demand."""
        ck = checkpoint_dir(self.env, confident=True)
        return ck, scenarios_dir(self.env, ck)


def checkpoint_dir(env: Path, seed: int = 0, confident: bool = False) -> Path:
    return _cached(env, "checkpoint", {"seed": seed, "confident": confident},
                   ["--seed", seed] + (["--confident"] if confident else []))


def _ckpt_depends(ckdir: Path) -> str:
    return json.loads((ckdir / "checkpoint_info.json").read_text())["sha256"]


def scenarios_dir(env: Path, ckdir: Path, names: list[str] | None = None) -> Path:
    cli = ["--checkpoint", ckdir / "sam3.1_multiplex.pt"]
    for n in names or ():
        cli += ["--scenario", n]
    return _cached(env, "scenarios", {"scenarios": sorted(names) if names else "all"}, cli,
                   depends=_ckpt_depends(ckdir))


def module_dumps(env: Path, ckdir: Path, seed: int = 0) -> Path:
    return _cached(env, "modules", {"seed": seed},
                   ["--checkpoint", ckdir / "sam3.1_multiplex.pt", "--seed", seed],
                   depends=_ckpt_depends(ckdir))


def reference(env: Path | None = None) -> Reference | None:
    """Checkpoint and scenario outputs (made and cached on first use); None without the env."""
    env = env or find_env()
    if env is None:
        return None
    ck = checkpoint_dir(env)
    return Reference(env=env, checkpoint_dir=ck, scenarios=scenarios_dir(env, ck))


# ------------------------------------------------------------------------------------------ reading
def unpack_masks(packed: np.ndarray, shape) -> np.ndarray:
    shape = tuple(int(s) for s in shape)
    hw = int(np.prod(shape[1:])) if len(shape) > 1 else 0
    return np.unpackbits(packed, axis=1, count=hw).reshape(shape).astype(bool)


def load_scenario(folder: Path, name: str) -> tuple[dict, list[dict]]:
    """(the scenario's JSON, its responses): each response is the JSON record plus its arrays
    (``out_obj_ids``, ``out_probs``, ``out_boxes_xywh``, ``out_binary_masks`` as bool [N,H,W]);
    ``outputs`` is None for a request whose response carried no outputs."""
    folder = Path(folder)
    jpath, npath = folder / f"{name}.json", folder / f"{name}.npz"
    if not jpath.is_file() or not npath.is_file():
        raise ReferenceError(f"scenario {name!r} not found in {folder} (expected {jpath.name}, {npath.name})")
    doc = json.loads(jpath.read_text())
    responses = []
    with np.load(npath) as z:
        by_i: dict[int, dict] = {}
        for k in z.files:
            i, field = k.split("/", 1)
            by_i.setdefault(int(i), {})[field] = z[k]
    for rec in doc["responses"]:
        arrays = by_i.get(rec["i"])
        r = dict(rec)
        if rec.get("outputs", "present") is None or arrays is None:
            r["outputs"] = None
        else:
            out = {k: v for k, v in arrays.items() if not k.startswith("out_binary_masks_")}
            if "out_binary_masks_packbits" in arrays:
                out["out_binary_masks"] = unpack_masks(arrays["out_binary_masks_packbits"],
                                                       arrays["out_binary_masks_shape"])
            r["outputs"] = out
        responses.append(r)
    return doc, responses


def scenario_digest(folder: Path, name: str) -> str:
    """Recompute the run's digest from the .npz (as driver.py computes it while recording)."""
    doc, responses = load_scenario(folder, name)
    h = hashlib.sha256()
    for r in responses:
        if r["outputs"] is None:
            h.update(f"{r['i']}:none".encode())
            continue
        h.update(f"{r['i']}:{r['type']}:{r['frame_index']}".encode())
        for k in sorted(r["outputs"]):
            a = np.ascontiguousarray(r["outputs"][k])
            h.update(k.encode() + b"\0" + str(a.dtype).encode() + b"\0" + str(a.shape).encode() + b"\0")
            h.update(a.tobytes())
    return h.hexdigest()


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m graphs.sam31.reference",
                                 description="make (or find) the cached SAM 3.1 reference outputs")
    ap.add_argument("--modules", action="store_true", help="also the module input/output dumps")
    a = ap.parse_args(argv)
    env = find_env()
    if env is None:
        print(f"error: {missing_reason()}", file=sys.stderr)
        return 2
    r = reference(env)
    print(f"env         {r.env}\ncheckpoint  {r.checkpoint}\nscenarios   {r.scenarios}")
    ck, sc = r.confident()
    print(f"confident   {ck}\n            {sc}")
    if a.modules:
        print(f"modules     {r.modules()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
