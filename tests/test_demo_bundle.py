"""The demo bundle shipped in sam3track/demo_bundle/: current, complete, packaged, and usable without torch."""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import numpy as np
import pytest

from sam3track.errors import Sam3TrackError

from .conftest import REPO

SHIPPED = REPO / "sam3track" / "demo_bundle"
# Sizes of the symbolic axes for the seeded inputs: other than the exporter's trace sizes (2, points 3).
SIZES = dict(prompts=3, images=1, objects=3, memories=4, pointers=5, points=4)


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def _bundle_files(bundle: Path) -> list[str]:
    """Every file the runtime reads, relative to the bundle: graphs, tokenizer, manifest."""
    m = _manifest(bundle)
    files = ["manifest.json"]
    for g in m["graphs"].values():
        files += [g["file"], *g["data_files"]]
    files += [f"{m['tokenizer']['dir']}/{f}" for f in m["tokenizer"]["files"]]
    return files


@pytest.mark.slow
def test_shipped_bundle_gives_the_outputs_of_a_fresh_export(tmp_path):
    """Regenerating with the documented command gives graphs that compute what the shipped ones do."""
    import onnxruntime as ort

    from graphs import export
    from graphs.sam3 import specs
    from graphs.comparison import FP32_TOL, relative_error
    from graphs.sam3.checkpoint import load_model
    from graphs.sam3.tiny import DEMO, write_tiny_checkpoint

    fresh = tmp_path / "demo_bundle"
    assert export.main(["--demo", "--out", str(fresh)]) == 0
    shipped_manifest = _manifest(SHIPPED)
    assert _manifest(fresh)["source"] == {**shipped_manifest["source"],
                                          "weights_sha256": _manifest(fresh)["source"]["weights_sha256"]}
    assert shipped_manifest["source"]["tiny_preset"] == "demo" and shipped_manifest["source"]["checkpoint"] is None
    assert not (fresh / "source").exists() and not (SHIPPED / "source").exists()

    seed = shipped_manifest["source"]["tiny_seed"]
    dims = specs.Dims.from_model(load_model(write_tiny_checkpoint(tmp_path / "ck", seed=seed, preset=DEMO)))
    assert set(shipped_manifest["graphs"]) == set(export.GRAPHS)
    for name, spec in specs.graph_specs(dims).items():
        feeds = {k: v.numpy() for k, v in specs.sample_inputs(spec, dims, SIZES, seed=7).items()}
        outputs = {}
        for bundle in (SHIPPED, fresh):
            session = ort.InferenceSession(str(bundle / f"{name}.onnx"), providers=["CPUExecutionProvider"])
            outputs[bundle] = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
        for out_spec, got, want in zip(spec.outputs, outputs[SHIPPED], outputs[fresh]):
            assert got.shape == want.shape, (name, out_spec.name)
            _, rel = relative_error(got, want)
            assert rel <= FP32_TOL, f"{name}.{out_spec.name}: shipped differs from a fresh export (rel {rel:.1e}); " \
                                    f"regenerate: python -m graphs.export --demo --out sam3track/demo_bundle --overwrite"


def test_shipped_bundle_passes_the_check_against_its_rebuilt_checkpoint():
    # The shipped bundle has no checkpoint: graphs.check rebuilds it from the manifest's seed and preset.
    from graphs.sam3.check import run_checks

    rows = run_checks(SHIPPED, graphs=["text_encoder", "memory_encoder"], log=lambda *_: None)
    assert rows and all(r.ok for r in rows), [(r.graph, r.case, r.output, r.rel) for r in rows if not r.ok]


def test_shipped_bundle_is_small_tracked_and_packaged():
    files = _bundle_files(SHIPPED)
    assert all((SHIPPED / f).is_file() for f in files)
    total = sum((SHIPPED / f).stat().st_size for f in files)
    assert total < 8_000_000, f"the shipped demo bundle grew to {total / 1e6:.1f} MB"
    # A non-editable install gets only what package-data names.
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["sam3track"]
    unpackaged = [f for f in files if not any(fnmatch.fnmatch(f"demo_bundle/{f}", p) for p in patterns)]
    assert not unpackaged, f"pyproject.toml package-data leaves out {unpackaged}"
    if (REPO / ".git").exists():
        tracked = subprocess.run(["git", "ls-files", "sam3track/demo_bundle"], cwd=REPO, capture_output=True,
                                 text=True, check=True).stdout.split()
        untracked = [f for f in files if f"sam3track/demo_bundle/{f}" not in tracked]
        assert not untracked, f"not committed (check .gitignore): {untracked}"


def test_missing_shipped_bundle_says_how_to_regenerate(tmp_path, monkeypatch):
    from sam3track import demo

    monkeypatch.setattr(demo, "__file__", str(tmp_path / "demo.py"))
    with pytest.raises(Sam3TrackError, match="graphs.export --demo --out sam3track/demo_bundle") as info:
        demo.demo_bundle_path()
    assert str(tmp_path / "demo_bundle" / "manifest.json") in str(info.value)


def test_demo_runs_without_torch_and_finds_objects(tmp_path):
    """The runtime demo path: shipped bundle, load, track the demo's frames; torch is never imported."""
    code = textwrap.dedent(f"""
        import sys
        import sam3track
        from sam3track.commands.demo import DEMO_OVERRIDES, DEMO_PROMPTS, DEMO_START_FRAME, demo_clip
        from sam3track.demo import demo_bundle_path

        predictor = sam3track.load(demo_bundle_path(), **DEMO_OVERRIDES)
        seen = set()
        with predictor.start_session(str(demo_clip())) as session:
            for prompt in DEMO_PROMPTS:
                session.add_prompt(frame_index=DEMO_START_FRAME, text=prompt)
            for result in session.propagate(start_frame=DEMO_START_FRAME, max_frames=6):
                seen.update(int(i) for i in result.object_ids)
        print("objects", len(seen))
        print("imported", sorted(m for m in ("torch", "transformers") if m in sys.modules))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("objects", "imported")))
    assert lines["imported"] == "[]"
    assert int(lines["objects"]) > 0


def test_info_describes_the_shipped_bundle_and_only_existing_backends(capsys):
    from sam3track.cli import main

    assert main(["info", str(SHIPPED)]) == 0
    out = capsys.readouterr().out
    assert "RANDOM weights" in out and "MISSING" not in out
    backends = [line.strip() for line in out.split("\nbackends\n", 1)[1].splitlines()]
    assert [line.split()[0] for line in backends] == ["onnxruntime", "openvino", "acl", "auto:"], backends
    assert backends[3] == "auto: $SAM3TRACK_BACKEND=onnxruntime"  # the suite's pin (conftest.py)
    # the bf16 option is listed only where OpenVINO's CPU plugin reports BF16 (machines differ)
    from sam3track.backends.openvino import cpu_capabilities

    has_bf16 = "BF16" in cpu_capabilities()
    assert ("precision fp32 (default), bf16" if has_bf16 else "precision fp32 (no bf16 on this CPU)") in backends[1]
    assert "pyacl not found" in backends[2] and "python -m om.convert" in backends[2]
