"""Clicks and boxes through the session API: new objects, refinements, their rules next to the detector,
and every bad input refused with one clear error while the session stays usable.

Parity with transformers' tracker is in test_interactive_parity.py; these tests assert the behaviour
the reference has no counterpart for (user objects beside text-detected ones)."""

from __future__ import annotations

import numpy as np
import pytest

import sam3track
from sam3track.postprocess import upsample_masks
from sam3track.video import open_video

from .conftest import CLIPS, mask_iou


@pytest.fixture(scope="module")
def frames():
    with open_video(CLIPS / "bikes.mp4") as video:
        return np.stack([video.read(i) for i in range(76, 90)])


@pytest.fixture(scope="module")
def predictor(tiny_bundle):
    with sam3track.load(tiny_bundle, hotstart_delay=0) as p:
        yield p


def _mask_of(result, obj_id):
    ids = result.object_ids.tolist()
    return result.masks[ids.index(obj_id)] if obj_id in ids else np.zeros(result.masks.shape[1:], bool)


def _centre(frames):
    h, w = frames.shape[1:3]
    return [w / 2, h / 2]


def capture_decoder_outputs(session):
    """Record the interactive decoder's low-res masks per call (host copies)."""
    calls = []
    run = session.backend.run

    def recording(graph, inputs, outputs=None):
        out = run(graph, inputs, outputs)
        if graph.name == "interactive_decoder":
            calls.append(session.backend.to_host(out["low_res_masks"])[:, 0])
        return out

    session.backend.run = recording
    return calls


def test_a_click_adds_an_object_shown_at_once_and_tracked_from_its_frame(predictor, frames):
    with predictor.start_session(frames) as s:
        result = s.add_prompt(frame_index=3, points=[_centre(frames)], labels=[1])
        assert isinstance(result, sam3track.FrameResult) and result.frame_index == 3
        assert s.object_ids == [0]
        assert result.object_ids.tolist() == [0]  # the prompted object, even if its mask were empty
        assert result.tracker_probs.dtype == np.float32 and result.tracker_probs.shape == result.object_ids.shape
        tracked = list(s.propagate())  # starts at the prompted frame, as the reference does
        assert [r.frame_index for r in tracked] == list(range(3, len(frames)))
        assert s.object_ids == [0]
        both = list(s.propagate(direction="both"))
        assert [r.frame_index for r in both] == list(range(3, len(frames))) + [2, 1, 0]
        # backward starts where the reference tracker starts it too: the earliest prompted frame
        assert [r.frame_index for r in s.propagate(direction="backward")] == [3, 2, 1, 0]
        assert s.add_prompt(frame_index=0, boxes=[10, 10, 60, 50]).frame_index == 0
        assert s.object_ids == [0, 1]  # a box without obj_id: the next new object


def test_clicks_replace_the_frames_earlier_ones_by_default_and_accumulate_when_asked(predictor, frames):
    """clear_old_points defaults to True, as the official request API and transformers' clear_old_inputs."""
    with predictor.start_session(frames) as s:
        s.add_prompt(frame_index=0, points=[[20, 20]], obj_id=5)
        s.add_prompt(frame_index=0, points=[[40, 30]], labels=[0], obj_id=5, clear_old_points=False)
        assert s.clicks.prompts[5][0].labels.tolist() == [1, 0]
        s.add_prompt(frame_index=2, points=[[40, 30]], obj_id=5, clear_old_points=False)
        assert s.clicks.prompts[5][2].labels.tolist() == [1]  # another frame: its own list
        s.add_prompt(frame_index=0, points=[[30, 30]], labels=[0], obj_id=5)  # the default starts over
        assert s.clicks.prompts[5][0].labels.tolist() == [0]
        s.add_prompt(frame_index=0, boxes=[10, 10, 50, 40], points=[[30, 30]], obj_id=5)
        assert s.clicks.prompts[5][0].labels.tolist() == [2, 3, 1]  # box corners first, as the processor
        with pytest.raises(sam3track.PromptError, match="a box must come before any click"):
            s.add_prompt(frame_index=0, boxes=[10, 10, 50, 40], obj_id=5, clear_old_points=False)
        assert s.object_ids == [5]
    import inspect

    from sam3track.compat import OfficialPredictor  # one default for the Python and the request API
    assert inspect.signature(type(s).add_prompt).parameters["clear_old_points"].default is True
    assert "clear_old_points\", True)" in inspect.getsource(OfficialPredictor._add_prompt)


def test_a_new_object_with_an_empty_mask_is_in_its_prompts_result(predictor, frames, monkeypatch):
    """The README's `obj_id=r.object_ids[-1]` must name the object just made, even when the decoder
    finds nothing there: the prompted object is always in the prompt call's result."""
    from sam3track.families.sam3.frame_loop import FrameLoop

    apply = FrameLoop.apply_clicks

    def nothing_for_the_new_object(self, features, frame, requests, num_frames):
        out = apply(self, features, frame, requests, num_frames)
        for r in requests:
            out.masks[r.obj_id] = np.full_like(out.masks[r.obj_id], -10.0)  # an empty mask
        return out

    with predictor.start_session(frames) as s:
        first = s.add_prompt(frame_index=1, boxes=[150, 40, 420, 250])
        assert first.object_ids.tolist() == [0] and first.masks[0].any()
        monkeypatch.setattr(FrameLoop, "apply_clicks", nothing_for_the_new_object)
        r = s.add_prompt(frame_index=1, points=[[20, 20]], labels=[1])
        assert s.object_ids == [0, 1] and r.object_ids.tolist() == [0, 1] and r.object_ids[-1] == 1
        assert not r.masks[1].any() and r.boxes_xyxy[1].tolist() == [0, 0, 0, 0]
        assert len(r.tracker_probs) == len(r.scores) == len(r.prompts) == 2
        assert 1 in s.add_prompt(frame_index=1, points=[[30, 30]], obj_id=r.object_ids[-1]).object_ids


def test_decoder_output_is_the_mask_on_the_prompted_frame_and_stays_after_repropagation(predictor, frames):
    with predictor.start_session(frames) as s:
        calls = capture_decoder_outputs(s)
        shown = s.add_prompt(frame_index=2, boxes=[20, 20, 140, 120], obj_id=1)
        assert len(calls) == 1
        expected = upsample_masks(calls[0], *frames.shape[1:3])[0]
        assert np.array_equal(_mask_of(shown, 1), expected)
        again = {r.frame_index: r for r in s.propagate(direction="both")}
        assert np.array_equal(_mask_of(again[2], 1), expected)  # a conditioning frame keeps its output
        assert len(calls) == 1  # propagation never runs the interactive decoder


def test_refining_a_text_detected_object_keeps_its_id_and_later_frames_follow(predictor, frames):
    def run(refine: bool):
        s = predictor.start_session(frames)
        s.add_prompt(frame_index=0, text="bike")
        before = {r.frame_index: r for r in s.propagate()}
        target = s.object_ids[0]
        old = _mask_of(before[4], target)
        assert old.any(), "the clip must give a detected object to refine"
        if not refine:
            return s, target, old, None, {r.frame_index: r for r in s.propagate(start_frame=4)}
        calls = capture_decoder_outputs(s)
        ys, xs = np.nonzero(old)
        inside = [float(xs.mean()), float(ys.mean())]
        h, w = old.shape
        outside = [w - 1 - inside[0], h - 1 - inside[1]]  # the point mirrored through the frame's centre
        fixed = s.add_prompt(frame_index=4, points=[outside, inside], labels=[1, 0], obj_id=target)
        assert len(calls) == 1
        corrected = upsample_masks(calls[0], h, w)[0]
        assert np.array_equal(_mask_of(fixed, target), corrected)  # the decoder's output, at once
        assert not np.array_equal(corrected, old)
        return s, target, old, corrected, {r.frame_index: r for r in s.propagate(start_frame=4)}

    s, target, old, corrected, after = run(refine=True)
    plain_session, plain_target, _, _, plain = run(refine=False)
    assert plain_target == target
    assert target in s.object_ids and s.objects[target].interactive
    assert np.array_equal(_mask_of(after[4], target), corrected)  # re-propagation keeps the correction
    assert 4 in s.bank.summary()[target]["conditioning"]
    # later frames follow the correction: they differ from the run without it, and resemble the
    # corrected mask more than the uncorrected run does
    later = range(5, len(frames))
    follow = [mask_iou(_mask_of(after[t], target), corrected) for t in later]
    plain_follow = [mask_iou(_mask_of(plain[t], target), corrected) for t in later]
    assert any(not np.array_equal(_mask_of(after[t], target), _mask_of(plain[t], target)) for t in later)
    assert np.mean(follow) > np.mean(plain_follow), (follow, plain_follow)
    s.close()
    plain_session.close()


def test_user_objects_survive_the_hotstart_rules_and_no_birth_duplicates_them(tiny_bundle, frames):
    """End to end at the bundle's hotstart rules (which remove unconfirmed objects); the birth rule itself
    is asserted on synthetic masks in test_planning.py."""
    with sam3track.load(tiny_bundle) as p, p.start_session(frames) as s:
        s.add_prompt(frame_index=0, boxes=[150, 40, 420, 250], obj_id=100)
        s.add_prompt(frame_index=0, points=[[300, 150], [520, 60]], labels=[1, 0], obj_id=101)
        s.add_prompt(frame_index=0, text="bike")
        user = {}
        births = {}
        for r in s.propagate():
            for i, m in zip(r.object_ids.tolist(), r.masks):
                (user if i in (100, 101) else births).setdefault(r.frame_index, {})[i] = m
        assert 100 in s.object_ids and 101 in s.object_ids  # never removed by the hotstart or unmatched rules
        assert all(s.objects[o].interactive for o in (100, 101))
        for frame, objs in births.items():
            for i, m in objs.items():
                if frame == min(f for f, o in births.items() if i in o):  # where it was born
                    for u in user.get(frame, {}).values():
                        assert mask_iou(m, u) < 0.1, f"object {i} duplicates a user object on frame {frame}"


def test_remove_prompt_and_reset(predictor, frames):
    with predictor.start_session(frames) as s:
        s.add_prompt(text="phone")
        s.add_prompt(text="bike")
        list(s.propagate())
        by_prompt = {o: s.objects[o].prompt for o in s.object_ids}
        assert set(by_prompt.values()) >= {0, 1}, "both prompts must find objects on this clip"
        phone = [o for o, k in by_prompt.items() if k == 0]
        bike = [o for o, k in by_prompt.items() if k == 1]
        s.add_prompt(frame_index=1, points=[[30, 30]], obj_id=phone[0])  # a refined object stays
        s.remove_prompt("phone")
        assert s.prompts == ["bike"]
        assert all(o not in s.object_ids for o in phone[1:])
        assert phone[0] in s.object_ids and s.objects[phone[0]].prompt == -1
        assert all(s.objects[o].prompt == 0 for o in bike)  # indices shift with the list
        results = list(s.propagate(max_frames=3))
        assert all(p in ("", "bike") for r in results for p in r.prompts)
        with pytest.raises(sam3track.PromptError, match="not in this session"):
            s.remove_prompt("phone")
        s.reset()
        assert s.prompts == [] and s.object_ids == [] and s.clicks.prompts == {}
        with pytest.raises(sam3track.PromptError, match="no prompt"):
            list(s.propagate())


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(points=[[-5, 10]]), sam3track.PromptError, r"point 0 \[-5.0, 10.0\] lies outside the 640x272 frame"),
    (dict(points=[[10, 10], [20, 20]], labels=[1]), sam3track.PromptError, "2 points need 2 labels"),
    (dict(points=[[10, 10]], labels=[2]), sam3track.PromptError, "must each be 1 .* or 0"),
    (dict(boxes=[50, 10, 20, 40]), sam3track.PromptError, "x1 < x0"),
    (dict(boxes=[10, 10, 20, 400]), sam3track.PromptError, "reaches outside"),
    (dict(points=[], boxes=None), sam3track.PromptError, "no point and no box"),
    (dict(points=[], boxes=[]), sam3track.PromptError, "no point and no box"),
    (dict(points=[[10, 10]], frame_index=99), sam3track.FrameIndexError, "frame index 99 is out of range"),
    (dict(points=[[10, 10]], obj_id=-3), sam3track.ObjectIdError, "obj_id -3 must be a whole number"),
    (dict(points=[[10, 10]], obj_id=0), sam3track.ObjectIdError, "object 0 is not tracked, and ids are never reused"),
    (dict(points=[[10, 10]], text="bike"), sam3track.PromptError, "not both"),
    (dict(points=[["a", 10]]), sam3track.PromptError, "must be numbers"),
    (dict(points=[[float("nan"), 10]]), sam3track.PromptError, "not a finite number"),
])
def test_bad_clicks_get_one_clear_error_and_the_session_stays_usable(predictor, frames, kwargs, error, match):
    assert frames.shape[1:3] == (272, 640)
    with predictor.start_session(frames) as s:
        s.add_prompt(frame_index=0, points=[[10, 10]], obj_id=0)
        s.remove_object(0)
        s.add_prompt(frame_index=0, points=[[100, 100]], obj_id=1)
        state = (s.object_ids, {o: dict(f) for o, f in s.clicks.prompts.items()}, s.bank.summary())
        kwargs = {"frame_index": 1, **kwargs}
        with pytest.raises(error, match=match):
            s.add_prompt(**kwargs)
        assert (s.object_ids, {o: dict(f) for o, f in s.clicks.prompts.items()}, s.bank.summary()) == state
        with pytest.raises(sam3track.ObjectIdError, match="object 7 is not tracked"):
            s.remove_object(7)
        assert s.add_prompt(frame_index=1, points=[[60, 60]], obj_id=1).frame_index == 1  # still usable
        assert len(list(s.propagate(max_frames=2))) == 2


def test_a_series_of_clicks_on_one_frame_runs_the_backbone_once(predictor, frames):
    with predictor.start_session(frames) as s:
        before = s.backend.calls["backbone"]
        s.add_prompt(frame_index=1, points=[[100, 100]], obj_id=1)
        s.add_prompt(frame_index=1, points=[[120, 90]], labels=[0], obj_id=1)
        s.add_prompt(frame_index=1, boxes=[300, 50, 400, 200], obj_id=2)
        assert s.backend.calls["backbone"] - before == 1
        s.add_prompt(frame_index=2, points=[[100, 100]], obj_id=1)
        assert s.backend.calls["backbone"] - before == 2


def test_frame_spans_hold_exactly_the_frames_added():
    from sam3track.families.sam3.objects import FrameSpans

    rng = np.random.default_rng(0)
    for _ in range(50):
        spans, truth = FrameSpans(), set()
        for frame in rng.integers(0, 40, 30).tolist():
            spans.add(frame)
            truth.add(frame)
        assert all((f in spans) == (f in truth) for f in range(-3, 45))
        assert all(a[1] + 1 < b[0] for a, b in zip(spans.runs, spans.runs[1:]))  # runs stay apart
    spans = FrameSpans()
    for f in range(10_000):  # a long propagation costs one run
        spans.add(f)
    assert spans.runs == [[0, 9999]]
