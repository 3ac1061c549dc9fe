"""Runs of this package's own reference scripts in Meta's SAM 3.1 environment, cached.

graphs/sam31/reference.py makes the seeded checkpoint and the module dumps; three more scripts of
reference/sam31/ answer what those do not: Meta's tokenizer on given strings (``tokenize_texts.py``),
the per-frame features Meta's predictor hands its tracker, on both of its grounding paths
(``dump_frame_features.py``), and the settings its builder gives the predictor (``builder_config.py``).
Each output is cached under ``<reference home>/outputs/<kind>-<key>/`` as graphs.sam31.reference does
(written to ``.partial``, renamed once complete), keyed by the script and harness sources, the env,
the arguments and the checkpoint.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
from pathlib import Path

from . import reference as ref

SCRIPTS = {"tokens": "tokenize_texts.py", "frame-features": "dump_frame_features.py",
           "builder-config": "builder_config.py"}


def _key(kind: str, env: Path, args: dict) -> str:
    h = hashlib.sha256()
    h.update(str(Path(env).name).encode())
    for name in (SCRIPTS[kind],) + ref.HARNESS:
        h.update(name.encode() + b"\0" + hashlib.sha256((ref.REF_DIR / name).read_bytes()).digest())
    h.update(json.dumps(args, sort_keys=True, ensure_ascii=False).encode())
    return h.hexdigest()[:16]


def _cached(kind: str, env: Path, args: dict, cli: list, inputs: dict[str, str] | None = None) -> Path:
    """Run SCRIPTS[kind] with ``cli`` (+ ``--out DIR/<out>``) once per key; returns the output folder.
    ``inputs``: files to write into the folder first (name -> text), passed by path in ``cli`` as
    ``{name}`` placeholders."""
    out = ref.reference_home() / "outputs" / f"{kind}-{_key(kind, env, args)}"
    if (out / "DONE.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "DONE.json").is_file():
            return out
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name, text in (inputs or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        args_cli = [str(a).format(dir=tmp) for a in cli]
        p = ref.run_script(env, SCRIPTS[kind], args_cli)
        (tmp / "run.log").write_text(p.stdout[-20000:] + "\n--- stderr ---\n" + p.stderr[-20000:])
        (tmp / "DONE.json").write_text(json.dumps({"kind": kind, "args": args}, ensure_ascii=False) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def meta_token_ids(env: Path, bpe: Path, texts: list[str]) -> dict:
    """Meta's SimpleTokenizer on ``texts``: {"texts", "ids" [[32]], "cleaned"}."""
    bpe = Path(bpe)
    args = {"bpe_sha256": hashlib.sha256(bpe.read_bytes()).hexdigest(), "texts": texts}
    out = _cached("tokens", env, args, ["--bpe", bpe, "--texts", "{dir}/texts.json", "--out", "{dir}/ids.json"],
                  inputs={"texts.json": json.dumps(texts, ensure_ascii=False)})
    return json.loads((out / "ids.json").read_text(encoding="utf-8"))


def frame_features(env: Path, checkpoint: Path) -> Path:
    """Folder with features.npz + index.json of dump_frame_features.py for ``checkpoint``."""
    checkpoint = Path(checkpoint)
    info = checkpoint.parent / "checkpoint_info.json"
    sha = json.loads(info.read_text())["sha256"] if info.is_file() else \
        hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    return _cached("frame-features", env, {"checkpoint_sha256": sha},
                   ["--checkpoint", checkpoint, "--out", "{dir}"])


def builder_config(env: Path) -> dict:
    """Meta's built predictor's settings: {"predictor", "model", "tracker", "config"}."""
    out = _cached("builder-config", env, {}, ["--out", "{dir}/builder_config.json"])
    return json.loads((out / "builder_config.json").read_text())
