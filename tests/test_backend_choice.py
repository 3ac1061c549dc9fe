"""backend="auto" (the default): the fidelity gate's decisions, its cached verdict, and the rules that
skip it (explicit backend=, precision=, $SAM3TRACK_BACKEND). The suite otherwise pins onnxruntime
(conftest.py); here that pin is removed and the verdicts go to a private cache folder."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import sam3track
from sam3track import backend_choice as bc


@pytest.fixture()
def auto(monkeypatch, tmp_path):
    monkeypatch.delenv(bc.ENV_BACKEND, raising=False)
    monkeypatch.setenv("SAM3TRACK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "backend-choice"


def _frames(ids_and_masks):
    return [(ids, {i: np.asarray(m, bool) for i, m in zip(ids, masks)}) for ids, masks in ids_and_masks]


def test_the_gate_keeps_the_fastest_path_within_the_parity_tolerances(monkeypatch):
    """Faster but outside tolerance loses; a path that fails to run is recorded, not fatal; equal masks
    and 0.8x the time wins; a path under 10% faster than ONNX Runtime fp32 does not."""
    box = np.zeros((8, 8), bool)
    box[2:6, 2:6] = True
    shifted = np.roll(box, 1, axis=1)  # IoU 0.6
    base = _frames([([1], [box])] * 3)
    runs = {"onnxruntime": (base, 100.0),
            "openvino precision=bf16": (_frames([([1], [box]), ([1], [shifted]), ([1], [box])]), 50.0),
            "broken": None, "openvino": (base, 80.0), "slightly": (base, 95.0)}

    def track(predictor, frames, click, sweep=False):
        assert sweep is (predictor != "onnxruntime")  # candidates only: the baseline is the reference
        if runs[predictor] is None:
            raise RuntimeError("cannot compile")
        return (*runs[predictor], None)  # resident memory unknown: never a reason to refuse

    monkeypatch.setattr(bc, "track_gate_clip", track)
    bundle = type("B", (), {"root": "b", "manifest": {"preprocessing": {"image_size": 16}}})()
    candidates = [bc.Candidate("openvino", {"precision": "bf16"}), bc.Candidate("broken"),
                  bc.Candidate("openvino"), bc.Candidate("slightly")]
    choice = bc.run_gate(bundle, candidates, lambda c: c.label)
    assert (choice.backend, choice.options) == ("openvino", {})
    by_path = {m["path"]: m for m in choice.measured}
    assert by_path["openvino precision=bf16"]["passed"] is False and by_path["openvino precision=bf16"]["iou_min"] < 0.95
    assert "cannot compile" in by_path["broken"]["error"] and by_path["openvino"]["passed"]
    assert "outside the parity tolerances" in choice.reason

    runs["openvino"] = (base, 95.0)
    assert bc.run_gate(bundle, candidates[2:], lambda c: c.label).backend == "onnxruntime"


def test_a_faster_faithful_path_that_holds_much_more_memory_than_onnxruntime_loses(monkeypatch):
    """OpenVINO bf16 at full size holds 9 GB where ONNX Runtime fp32 holds 3: over what the defaults promise
    (3.5 GB, or ONNX Runtime's own where that is more), so auto keeps ONNX Runtime and says how to take it
    anyway; on a machine whose half is less, it says that instead. Within the allowance the faster path
    wins (at mid: twice ONNX Runtime's 1.4 GB, under 3.5 GB). The machine's memory is part of the
    verdict's key."""
    box = np.zeros((8, 8), bool)
    box[2:6, 2:6] = True
    base = _frames([([1], [box])] * 3)
    grows = {"onnxruntime": 3000.0, "openvino precision=bf16": 9000.0}  # MB each path adds while tracking
    rss = {"now": 1000.0}

    def track(predictor, frames, click, sweep=False):
        rss["now"] += grows[predictor]
        held, rss["now"] = rss["now"], 1000.0  # closed: back to where it was
        return base, (100.0 if predictor == "onnxruntime" else 30.0), held

    monkeypatch.setattr(bc, "track_gate_clip", track)
    monkeypatch.setattr(bc, "resident_mb", lambda: rss["now"])
    bundle = type("B", (), {"root": "b", "manifest": {"preprocessing": {"image_size": 16}}})()
    bf16 = [bc.Candidate("openvino", {"precision": "bf16"})]
    monkeypatch.setattr(bc, "memory_limit_mb", lambda: 8192.0)  # a 16 GB laptop
    choice = bc.run_gate(bundle, bf16, lambda c: c.label)
    assert choice.backend == "onnxruntime" and choice.measured[1]["memory_mb"] == 9000.0
    assert "needs 9,000 MB, over half this machine's memory (8,192 MB)" in choice.reason
    monkeypatch.setattr(bc, "memory_limit_mb", lambda: 65536.0)  # 128 GB: it fits the machine, not the allowance
    choice = bc.run_gate(bundle, bf16, lambda c: c.label)
    assert choice.backend == "onnxruntime" and not choice.measured[1]["fits"] and choice.measured[1]["passed"]
    assert "over the 3,584 MB the defaults keep to (the larger of 3,584 MB and ONNX Runtime fp32's own 3,000 MB" \
        in choice.reason
    assert "load with backend='openvino', precision='bf16' to take it anyway" in choice.reason
    grows["openvino precision=bf16"] = 3584.0  # at the allowance: it wins
    assert bc.run_gate(bundle, bf16, lambda c: c.label).options == {"precision": "bf16"}
    grows.update({"onnxruntime": 1400.0, "openvino precision=bf16": 2800.0})  # mid: twice, within 3.5 GB
    assert bc.run_gate(bundle, bf16, lambda c: c.label).options == {"precision": "bf16"}
    grows.update({"onnxruntime": 4000.0, "openvino precision=bf16": 4256.0})  # ONNX Runtime's own, +256: wins
    assert bc.run_gate(bundle, bf16, lambda c: c.label).options == {"precision": "bf16"}
    grows["openvino precision=bf16"] = 4300.0  # over both: refused
    assert bc.run_gate(bundle, bf16, lambda c: c.label).backend == "onnxruntime"
    # a refused path is offered by name only where it kept to the tolerances and was faster
    runs = {"onnxruntime": (base, 100.0), "openvino precision=bf16": (base, 95.0)}
    monkeypatch.setattr(bc, "track_gate_clip", lambda p, f, c, sweep=False: (*runs[p], 1000.0 + grows[p]))
    assert "to take it anyway" not in bc.run_gate(bundle, bf16, lambda c: c.label).reason  # not 10% faster
    shifted = _frames([([1], [np.roll(box, 2, axis=1)])] * 3)
    runs["openvino precision=bf16"] = (shifted, 30.0)
    assert "to take it anyway" not in bc.run_gate(bundle, bf16, lambda c: c.label).reason  # outside tolerance
    on_128_gb = bc.verdict_key({"graphs": {}}, None, bf16)
    monkeypatch.setattr(bc, "memory_limit_mb", lambda: 8192.0)
    assert bc.verdict_key({"graphs": {}}, None, bf16) != on_128_gb


def test_fp16_weights_are_the_users_choice_never_measured(monkeypatch):
    """weights="fp16" under auto: ONNX Runtime unmeasured, or OpenVINO where precision=/shapes= say so; an
    NPU device still runs acl (which then refuses the option) and $SAM3TRACK_BACKEND still wins."""
    monkeypatch.delenv(bc.ENV_BACKEND, raising=False)

    def never(candidate):
        raise AssertionError("the gate ran")

    bundle = type("B", (), {"root": "b", "manifest": {"graphs": {}, "preprocessing": {"image_size": 16}}})()
    choice = bc.choose(bundle, "cpu", None, None, None, None, never, weights="fp16")
    assert (choice.backend, choice.options) == ("onnxruntime", {"weights": "fp16"})
    assert "weights='fp16' given" in choice.reason
    choice = bc.choose(bundle, "cpu", None, "bf16", None, None, never, weights="fp16")
    assert (choice.backend, choice.options) == ("openvino", {"precision": "bf16", "weights": "fp16"})
    assert bc.choose(bundle, "npu:0", None, None, None, None, never, weights="fp16").backend == "acl"
    monkeypatch.setenv(bc.ENV_BACKEND, "openvino")
    assert bc.choose(bundle, "cpu", None, None, None, None, never, weights="fp16").backend == "openvino"


def test_ids_that_differ_on_one_frame_fail_the_gate():
    box = np.ones((4, 4), bool)
    same, mean, low = bc.compare(_frames([([1], [box]), ([1], [box])]), _frames([([1], [box]), ([2], [box])]))
    assert not same and (mean, low) == (0.5, 0.0)  # object 1 is missing from the second frame
    assert bc.compare(_frames([([1], [box])]), _frames([([1], [box])])) == (True, 1.0, 1.0)


def test_auto_measures_once_per_machine_and_bundle_then_reuses_the_verdict(tiny_bundle, auto, capfd):
    with sam3track.load(tiny_bundle) as p:
        first = p.backend_choice
    assert "backend=auto: measuring" in capfd.readouterr().err
    paths = [m["path"] for m in first.measured]
    assert paths == ["onnxruntime"] + [c.label for c in bc.cpu_candidates()]
    assert all(m.get("passed", True) is (m["same_ids"] and m["iou_mean"] >= 0.99 and m["iou_min"] >= 0.95)
               for m in first.measured if "error" not in m)
    verdicts = list(auto.glob("*.json"))
    assert len(verdicts) == 1
    with sam3track.load(tiny_bundle) as p:
        assert p.backend_choice == first
        assert type(p.backend).__module__ == f"sam3track.backends.{first.backend}"
    assert "measuring" not in capfd.readouterr().err

    verdicts[0].write_text("{not json")  # a torn or foreign file is a miss: measured again, no error
    with sam3track.load(tiny_bundle) as p:
        assert p.backend_choice.measured
    assert json.loads(verdicts[0].read_text())["backend"] == p.backend_choice.backend


def test_an_explicit_choice_skips_the_gate(tiny_bundle, auto, monkeypatch):
    with sam3track.load(tiny_bundle, backend="onnxruntime") as p:
        assert p.backend_choice.reason == "backend= given" and not p.backend_choice.measured
    with sam3track.load(tiny_bundle, precision="fp32") as p:
        assert p.backend_choice.backend == "openvino" and p.backend_choice.options == {"precision": "fp32"}
    monkeypatch.setenv(bc.ENV_BACKEND, "onnxruntime")
    with sam3track.load(tiny_bundle) as p:
        assert p.backend_choice.reason == "$SAM3TRACK_BACKEND=onnxruntime"
    assert not auto.exists()  # nothing was measured
    monkeypatch.setenv(bc.ENV_BACKEND, "onnx")
    with pytest.raises(sam3track.Sam3TrackError, match=r"\$SAM3TRACK_BACKEND='onnx' is not a backend"):
        sam3track.load(tiny_bundle)


def test_info_says_what_auto_runs_here(tiny_bundle, auto):
    def info():
        return subprocess.run([sys.executable, "-m", "sam3track", "info", str(tiny_bundle)], capture_output=True,
                              text=True, check=True).stdout

    if not bc.cpu_candidates():
        assert "auto (default): onnxruntime fp32" in info()
        return
    assert "not measured on this machine yet" in info()
    with sam3track.load(tiny_bundle) as p:
        label = p.backend_choice.backend
    assert f"auto (default): {label}" in info()


def test_too_little_memory_for_the_gate_takes_onnxruntime_unmeasured(tiny_bundle, auto, monkeypatch, capfd):
    """The gate peaks at about GATE_MEMORY_FACTOR times the bundle's weights (12.6 GB for the full-size
    bundle): with less available, auto takes ONNX Runtime fp32 without measuring, says why, and keeps no
    verdict (memory comes back)."""
    import sam3track.call_sizes as call_sizes

    monkeypatch.setattr(call_sizes, "available_memory", lambda: 1 << 20)
    with sam3track.load(tiny_bundle) as p:
        choice = p.backend_choice
    assert choice.backend == "onnxruntime" and not choice.measured
    assert choice.reason.startswith("ONNX Runtime fp32, not measured: measuring the faster paths would take about")
    assert "measuring which path" not in capfd.readouterr().err and not auto.exists()


def test_the_gate_runs_every_row_taking_graph_of_a_candidate_at_several_rows(tiny_bundle):
    """The gate clip's calls are mostly of one row; after it, each graph with a row axis of a candidate
    runs at 1 and 3 rows, so a path that refuses larger calls (OpenVINO's CPU plugin did, on SAM 3.1's
    mask_init) fails the gate instead of the user's first frame with two births. The predictor is
    closed either way."""
    from sam3track.errors import BackendError

    predictor = sam3track.load(tiny_bundle, backend="onnxruntime")
    real, rows = predictor.backend.run, {}

    def run(graph, inputs, outputs=None):
        if graph.name == "mask_init":
            rows.setdefault(graph.name, []).append(inputs["masks"].shape[0])
            if inputs["masks"].shape[0] > 1:
                raise BackendError("refused: two or more rows")
        return real(graph, inputs, outputs)

    predictor.backend.run = run
    frames, clicks = bc.gate_clip(predictor.bundle.manifest)
    with pytest.raises(BackendError, match="two or more rows"):
        bc.track_gate_clip(predictor, frames[:2], clicks, sweep=True)
    # after the clip (whose memory the verdict reads): one-row births, then the sweep's 1 and 3
    assert rows["mask_init"][-2:] == [1, 3] and set(rows["mask_init"][:-2]) <= {1} and predictor.closed


def test_a_gate_clip_without_object_pixels_measures_no_candidate(monkeypatch):
    """Equal ids and IoU 1 over empty masks hold for any path that runs: where ONNX Runtime's run of the
    gate clip has no object pixels (a seeded SAM 3.1 model's clicks), no candidate is taken on that."""
    empty = _frames([([0, 1], [np.zeros((4, 4), bool)] * 2)] * 3)
    opened = []

    def track(predictor, frames, click, sweep=False):
        opened.append(predictor)
        return empty, (100.0 if predictor == "onnxruntime" else 10.0), None

    monkeypatch.setattr(bc, "track_gate_clip", track)
    bundle = type("B", (), {"root": "b", "manifest": {"preprocessing": {"image_size": 16}}})()
    choice = bc.run_gate(bundle, [bc.Candidate("openvino")], lambda c: c.label)
    assert (choice.backend, opened) == ("onnxruntime", ["onnxruntime"])
    assert "no object pixels" in choice.reason and [m["path"] for m in choice.measured] == ["onnxruntime"]
