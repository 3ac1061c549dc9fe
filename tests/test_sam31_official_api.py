"""SAM 3.1 bundles through the official request API (sam3track/compat.py) and the command line.

Meta's recorded requests (reference/sam31/run_scenarios.py) are sent to sam3track's OfficialPredictor
as Meta's predictor got them, on the same frames (a folder of the clip's first frames as lossless
PNGs, as the scenario handed them to Meta), and every response is compared with Meta's: the same ids,
mask IoU mean >= 0.99 and min >= 0.95, out_probs within 1e-3.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphs.sam31 import reference as ref

from .test_sam31_runtime import IOU_MEAN, IOU_MIN, SCORE_TOL, _frames, bundle  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow  # the full tier: Meta's requests through the official API


def _png_folder(frames: np.ndarray, folder):
    from PIL import Image

    folder.mkdir()
    for i, f in enumerate(frames):
        Image.fromarray(f).save(folder / f"{i:05d}.png")
    return folder


def _compare(want: dict, got: dict, ious: list, diffs: list) -> None:
    assert got["out_obj_ids"].tolist() == want["out_obj_ids"].tolist()
    for a, b in zip(want["out_binary_masks"], got["out_binary_masks"]):
        union = (a | b).sum()
        ious.append(1.0 if union == 0 else (a & b).sum() / union)
    if len(want["out_probs"]):
        diffs.append(float(np.abs(want["out_probs"] - got["out_probs"]).max()))


@pytest.mark.parametrize("name", ["text_two_buckets", "forward_backward", "boxes_with_text", "boxes_only"])
def test_meta_requests_through_the_official_api_give_meta_responses(bundle, sam31_reference, name, tmp_path):  # noqa: F811
    from sam3track.compat import OfficialPredictor

    doc, responses = ref.load_scenario(sam31_reference.scenarios, name)
    folder = _png_folder(_frames(doc), tmp_path / "frames")
    options = {k: v["value"] for k, v in doc["overrides"].items()}
    options.update(doc.get("builder_kwargs", {}))
    api = OfficialPredictor(bundle, **options)
    try:
        sid = api.handle_request({"type": "start_session", "resource_path": str(folder)})["session_id"]
        ious, diffs, i = [], [], 0
        while i < len(responses):
            rec = responses[i]
            request = dict(rec["request"], session_id=sid)
            if rec["type"] == "propagate_in_video":
                got = list(api.handle_stream_request(request))
                group = [r for r in responses[i:] if r["tag"] == rec["tag"]]
                assert [g["frame_index"] for g in got] == [r["frame_index"] for r in group]
                for want, out in zip(group, got):
                    _compare(want["outputs"], out["outputs"], ious, diffs)
                i += len(group)
            else:
                out = api.handle_request(request)
                assert out["frame_index"] == rec["frame_index"]
                _compare(rec["outputs"], out["outputs"], ious, diffs)
                i += 1
        assert ious, "the scenario shows no object"
        assert np.mean(ious) >= IOU_MEAN and min(ious) >= IOU_MIN, (np.mean(ious), min(ious))
        assert max(diffs, default=0.0) <= SCORE_TOL
        # reset_session forgets every object, as Meta's does
        assert api.handle_request({"type": "reset_session", "session_id": sid}) == {"is_success": True}
        assert api._sessions[sid].object_ids == []
        api.handle_request({"type": "close_session", "session_id": sid})
    finally:
        api.shutdown()


def test_track_command_runs_a_sam31_bundle(bundle, tmp_path):  # noqa: F811
    """`sam3track track` on a SAM 3.1 bundle writes the mask video and JSON for the frames asked."""
    import json

    from sam3track.cli import main

    from .conftest import CLIPS

    out = tmp_path / "masks.mp4"
    assert main(["track", str(CLIPS / "bikes.mp4"), "--prompt", "bike", "--bundle", str(bundle), "-o", str(out),
                 "--max-frames", "3", "--json", str(tmp_path / "masks.json"),
                 "--set", "score_threshold_detection=0.1", "--set", "new_det_thresh=0.1"]) == 0
    assert out.stat().st_size > 0
    data = json.loads((tmp_path / "masks.json").read_text())
    assert len(data["frames"]) == 3


def test_track_command_takes_boxes_as_exemplars_of_the_text_on_a_sam31_bundle(bundle, tmp_path, capsys, monkeypatch):  # noqa: F811
    """On a SAM 3.1 bundle --box is an exemplar of the --prompt on the start frame (one add_prompt with
    the text and every box, as Meta's SAM 3.1 detector prompt); a box elsewhere, or a second --prompt
    (each would start over), is one clear error."""
    from sam3track.cli import main
    from sam3track.families.sam31.session import Sam31Session

    from .conftest import CLIPS

    calls = []
    real = Sam31Session.add_prompt

    def spy(self, *args, **kwargs):
        calls.append(kwargs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Sam31Session, "add_prompt", spy)
    common = [str(CLIPS / "bikes.mp4"), "--bundle", str(bundle), "--max-frames", "2", "-o", str(tmp_path / "m.mp4")]
    assert main(["track", *common, "--prompt", "bike", "--box", "0:10,20,120,90", "--box", "0:30,30,60,70"]) == 0
    assert calls == [{"frame_index": 0, "text": "bike", "boxes": [[10.0, 20.0, 120.0, 90.0], [30.0, 30.0, 60.0, 70.0]]}]
    capsys.readouterr()
    for extra, message in ((["--prompt", "bike", "--box", "1:10,20,120,90"], "exemplar of the text prompt"),
                           (["--prompt", "bike", "--prompt", "car"], "one --prompt")):
        assert main(["track", *common, *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err, err
