"""python -m om.smoke without CANN: the whole kit on the fake atc and the pyacl emulator, on the session's
tiny plain bundle, with a short clip (the kit's default is 30 frames on hardware)."""

from __future__ import annotations

import json
import os

import pytest

from om.smoke import main

pytestmark = pytest.mark.slow  # a conversion, every gear of every graph, and two tracking runs


def test_the_smoke_kit_runs_end_to_end_on_the_emulator_and_says_so(tiny_plain_bundle, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "no-cann"))  # no atc: the kit must fall back, and say so
    out = tmp_path / "report"
    code = main(["--bundle", str(tiny_plain_bundle), "--soc", "Ascend910B2", "--out", str(out), "--frames", "6",
                 "--repeats", "1", "--prompt", "person", "bike", "--det-threshold", "0.3"])
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert code == 0 and report["verdicts"] == [], report["verdicts"]
    assert report["target"] == "emulated" and printed.startswith("[emulated]") and "EMULATED (no CANN)" in printed
    assert (out / "report.md").read_text().startswith("**EMULATED: no CANN on this machine")
    # atc ran at --log=info per graph and its output is kept
    for name, graph in report["conversion"]["graphs"].items():
        assert "--log=info" in graph["command"] and (out / "atc-logs" / f"{name}.atc.log").is_file()
    # every compiled gear ran against ONNX Runtime, and every desc matched the manifest
    gears = {name: [r["gear"] for r in g["runs"]] for name, g in report["graphs"].items()}
    assert len(gears["propagation_decoder"]) == 5 and len(gears["interactive_decoder"]) == 11
    assert all(g["runs"] and all(r["worst_rel"] <= 1e-4 for r in g["runs"]) for g in report["graphs"].values())
    assert all(not m["issues"] and m["desc"]["inputs"] for m in report["models"].values())
    t = report["tracking"]
    assert t["frames"] == 6 and t["frames_with_same_ids"] == 6 and t["objects_on_frame_0"] > 0  # a bike
    assert t["iou_mean"] >= 0.99
    assert not report["emulator_errors"] and os.environ["PATH"] == str(tmp_path / "no-cann")
