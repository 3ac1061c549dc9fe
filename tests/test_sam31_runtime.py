"""The SAM 3.1 runtime (sam3track/families/sam31/) against Meta's SAM 3.1 video predictor.

Parity: each scenario of reference/sam31/run_scenarios.py (Meta's predictor driven through its request
API on the sample clips, every response recorded) is replayed through sam3track's API on the tiny
bundle exported from the same seeded checkpoint, with the scenario's recorded overrides (thresholds,
max_num_objects, confirmation) as load options, and every response compared: the same object ids on
every frame, mask IoU mean >= 0.99 and min >= 0.95, scores (out_probs) within 1e-3.

Unit tests: the bucket registry, the torch-exact resizes and sort order, Meta's memory selection (the
contract of graphs/sam31/tracker_feeds), the config, bad input, and the graph calls per frame.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphs.sam31 import reference as ref

from .conftest import CLIPS, rounding_xfail

pytestmark = pytest.mark.slow  # the full tier: Meta's recorded SAM 3.1 scenarios replayed (minutes)

IOU_MEAN, IOU_MIN, SCORE_TOL = 0.99, 0.95, 1e-3


@pytest.fixture(scope="module")
def bundle(sam31_bundle):
    """The seeded SAM 3.1 checkpoint exported by the command line (conftest: once per test run)."""
    return sam31_bundle


def _frames(doc) -> np.ndarray:
    from sam3track.video import open_video

    with open_video(CLIPS / doc["clip"]["file"]) as v:
        return np.stack([v.read(i) for i in range(doc["clip"]["frames"])])


def _load(bundle, doc):
    import sam3track

    options = {k: v["value"] for k, v in doc["overrides"].items()}  # what Meta's run used, recorded
    options.update(doc.get("builder_kwargs", {}))
    return sam3track.load(bundle, **options)


def replay(bundle, doc, responses, stop_before=None):
    """Meta's requests through sam3track's API: [(response record, FrameResult or None)] in order, and
    the predictor (for its call counts). Clicks: Meta's relative coordinates become video pixels.
    Boxes: Meta's relative [x, y, w, h] become video-pixel [x0, y0, x1, y1]. Stops before the request
    tagged `stop_before`."""
    pred = _load(bundle, doc)
    frames = _frames(doc)
    height, width = frames.shape[1:3]
    session = pred.start_session(frames)
    groups = []
    for r in responses:
        if groups and r["request"]["type"] == "propagate_in_video" and groups[-1][0]["tag"] == r["tag"]:
            groups[-1].append(r)
        else:
            groups.append([r])
    out = []
    replay.session = session
    for group in groups:
        q = group[0]["request"]
        if group[0]["tag"] == stop_before:
            break
        if q["type"] == "add_prompt" and "bounding_boxes" in q:
            boxes = [[x * width, y * height, (x + w) * width, (y + h) * height] for x, y, w, h in q["bounding_boxes"]]
            out.append((group[0], session.add_prompt(q["frame_index"], text=q.get("text"), boxes=boxes,
                                                     box_labels=q.get("bounding_box_labels"))))
        elif q["type"] == "add_prompt" and "points" in q:
            points = [[x * width, y * height] for x, y in q["points"]]
            out.append((group[0], session.add_prompt(q["frame_index"], points=points, labels=q["point_labels"],
                                                     obj_id=q.get("obj_id"),
                                                     clear_old_points=q.get("clear_old_points", True))))
        elif q["type"] == "add_prompt":
            out.append((group[0], session.add_prompt(q["frame_index"], text=q["text"])))
        elif q["type"] == "propagate_in_video":
            results = list(session.propagate(q["propagation_direction"], start_frame=q.get("start_frame_index")))
            assert len(results) == len(group), (group[0]["tag"], len(results), len(group))
            out += list(zip(group, results))
        elif q["type"] == "remove_object":
            session.remove_object(q["obj_id"])
            out.append((group[0], None))
        else:
            raise AssertionError(f"request type {q['type']} not replayed")
    return out, pred


def parity(pairs) -> dict:
    """Per response: ids equal; IoU of every object's mask; |score difference|."""
    frames = ids_equal = 0
    ious, dps, bad = [], [], []
    for rec, mine in pairs:
        want = rec["outputs"]
        if want is None or mine is None:
            continue
        got = mine.to_official()
        frames += 1
        assert mine.frame_index == rec["frame_index"]
        if not np.array_equal(got["out_obj_ids"], want["out_obj_ids"]):
            bad.append((rec["i"], rec["tag"], rec["frame_index"], want["out_obj_ids"].tolist(),
                        got["out_obj_ids"].tolist()))
            continue
        ids_equal += 1
        for a, b in zip(want["out_binary_masks"], got["out_binary_masks"]):
            union = (a | b).sum()
            ious.append(1.0 if union == 0 else (a & b).sum() / union)
        if len(want["out_probs"]):
            dps.append(float(np.abs(want["out_probs"] - got["out_probs"]).max()))
    return dict(frames=frames, ids_equal=ids_equal, bad_ids=bad, iou_mean=float(np.mean(ious)) if ious else 1.0,
                iou_min=float(np.min(ious)) if ious else 1.0, score_diff=max(dps, default=0.0))


def internals(session) -> list[dict]:
    """The session's tracker states in the layout of the scenario JSON's ``internals`` snapshots:
    buckets as state-local object indices (-1 empty, -1116 a removed hole), conditioning frames with
    their conditioning objects, and the objects flagged on non-conditioning frames."""
    from sam3track.families.sam31.buckets import EMPTY, REMOVED

    out = []
    for state in session.tracker.states:
        index = {o: i for i, o in enumerate(state.obj_ids)}
        buckets = [[-1 if o == EMPTY else -1116 if o == REMOVED else index[o] for o in row]
                   for row in state.registry.slots]
        conds = {**state.kept_cond, **{f: r for f, r in state.frames.items() if r.cond}}
        cond = {str(f): sorted(index[o] for o in r.conditioning) for f, r in sorted(conds.items())}
        flagged = {str(f): sorted(index[o] for o in r.conditioning) for f, r in sorted(state.frames.items())
                   if not r.cond and r.conditioning}
        out.append({"buckets": buckets, "cond_frames": cond, "non_cond_frames_conditioning_objects": flagged})
    return out


def assert_same_states(session, doc, after_removal=False):
    """Buckets, slots, conditioning frames and flags of every tracker state equal Meta's at the end.

    after_removal: Meta keeps, per stored frame, the object-index map of when the frame was first
    stored; objects born later into that (conditioning) frame are missing from it, so a removal drops
    their masks and conditioning flags there (remove_objects' _slice_state). sam3track keeps them (a
    later re-tracking of that frame needs them; Meta's would hit mismatched sizes), so there only the
    conditioning frames themselves are compared, not their flag lists."""
    want = [{k: s[k] for k in ("buckets", "cond_frames", "non_cond_frames_conditioning_objects")}
            for s in doc["internals"][-1]["tracker_states"]]
    got = internals(session)
    if after_removal:
        for state in want + got:
            state["cond_frames"] = sorted(state["cond_frames"])
    assert got == want


def assert_parity(stats):
    assert stats["ids_equal"] == stats["frames"] and not stats["bad_ids"], stats["bad_ids"][:3]
    assert stats["iou_mean"] >= IOU_MEAN and stats["iou_min"] >= IOU_MIN, stats
    assert stats["score_diff"] <= SCORE_TOL, stats


# ------------------------------------------------------------------------------------------ parity
TEXT_SCENARIOS = ("text_one_bucket", "text_two_buckets", "text_cap16", "confirmation_gating", "hotstart_removal",
                  "births_after_frame0", "forward_backward")


@pytest.mark.parametrize("name", TEXT_SCENARIOS)
def test_text_scenario_matches_meta(bundle, sam31_reference, name, request):
    if name == "hotstart_removal":  # replayed once for this test and the planning contract's
        doc, responses, pairs, session, _ = request.getfixturevalue("hotstart_replay")
    else:
        doc, responses = ref.load_scenario(sam31_reference.scenarios, name)
        pairs, _ = replay(bundle, doc, responses)
        session = replay.session
    assert len(pairs) == len(responses)
    stats = parity(pairs)
    print(name, stats)
    assert_parity(stats)
    assert_same_states(session, doc)


@pytest.mark.parametrize("name", ("boxes_with_text", "boxes_only"))
def test_box_prompt_matches_meta(bundle, sam31_reference, name):
    """Boxes are detector exemplars on their frame (with the text, or with Meta's "<text placeholder>"
    without one): box_grounding_head runs there once, and propagation, which runs that frame again,
    detects with the text alone (grounding_head), as Meta's batched grounding does."""
    doc, responses = ref.load_scenario(sam31_reference.scenarios, name)
    pairs, pred = replay(bundle, doc, responses)
    assert len(pairs) == len(responses)
    stats = parity(pairs)
    print(name, stats)
    assert_parity(stats)
    assert_same_states(replay.session, doc)
    calls = pred.backend.calls
    assert calls["box_grounding_head"] == 1
    assert calls["grounding_head"] == len(responses) - 1  # every propagated frame, the prompt frame again too
    assert pairs[0][1].object_ids.size, "the box prompt found no object"


def test_boxes_change_what_the_detector_finds(bundle, sam31_reference):
    """The box tokens reach the detection: the same text with and without boxes scores the prompt
    frame's detections differently (else a graph ignoring its boxes would pass the parity test)."""
    doc, _ = ref.load_scenario(sam31_reference.scenarios, "boxes_with_text")
    pred = _load(bundle, doc)
    session = pred.start_session(_frames(doc)[:3])
    frame = doc["prompt_frame"]
    h, w = session.source.height, session.source.width
    t = session.tracker
    scores = {}
    real_detect = t.detect

    def detect(features, boxes=None):
        det = real_detect(features, boxes)
        scores[boxes is not None] = det
        return det

    t.detect = detect
    session.add_prompt(frame, text=doc["text"])
    session.add_prompt(frame, text=doc["text"], boxes=[[0.25 * w, 0.2 * h, 0.75 * w, 0.95 * h]])
    plain, boxed = scores[False], scores[True]
    assert np.abs(plain.scores - boxed.scores).max() > 1e-3


def test_remove_object_then_fetch_then_click_matches_meta(bundle, sam31_reference):
    """4 objects, forward; remove_object between propagations: the next propagation re-plays the cached
    frames without the removed object (Meta's propagation_fetch); then a click adds an object on frame 5
    (a singleton tracker state) and the next propagation tracks only that object (propagation_partial),
    merged into the cached frames."""
    doc, responses = ref.load_scenario(sam31_reference.scenarios, "remove_object")
    pairs, _ = replay(bundle, doc, responses)
    assert len(pairs) == len(responses)
    stats = parity(pairs)
    print(stats)
    assert_parity(stats)
    assert_same_states(replay.session, doc, after_removal=True)
    (victim,) = [r["request"]["obj_id"] for r in responses if r["type"] == "remove_object"]
    later = [m for r, m in pairs if m is not None and r["tag"] not in ("text", "forward")]
    assert later and all(victim not in m.object_ids for m in later)


def test_clicks_adding_an_object_match_meta(bundle, sam31_reference):
    """3 objects from text, forward; a click adds an object on frame 2; forward from 2 tracks it alone."""
    doc, responses = ref.load_scenario(sam31_reference.scenarios, "clicks")
    pairs, _ = replay(bundle, doc, responses, stop_before="click_refine")
    assert [r["tag"] for r, _ in pairs][-1] == "after_click_add"
    stats = parity(pairs)
    print(stats)
    assert_parity(stats)


@pytest.fixture(scope="module")
def clicks_replay(bundle, sam31_reference):
    doc, responses = ref.load_scenario(sam31_reference.scenarios, "clicks")
    pairs, _ = replay(bundle, doc, responses)
    assert len(pairs) == len(responses)
    return doc, pairs, replay.session


def test_clicks_refining_an_object_match_meta(clicks_replay):
    """The whole clicks scenario: 3 text objects, a click adds one on frame 2; a +/- click refines
    detector-born object 0 on frame 4 (extracted from its bucket into a singleton state: a hole in the
    bucket, its pointers kept, no memories), forward; one more click there keeping the old points
    (the interaction-only first refinement of a tracked frame), backward (frame 0 is then tracked
    beside the kept pointer-only conditioning output of the extraction). Same ids on every response,
    mask IoU mean and scores within the parity bounds, and Meta's tracker states at the end: the
    bucket with the hole, the click-added state, the refined object's state with conditioning frames
    0 and 4. (The per-mask IoU minimum: test_clicks_refining_an_object_min_iou.)"""
    doc, pairs, session = clicks_replay
    stats = parity(pairs)
    print(stats)
    assert stats["ids_equal"] == stats["frames"] and not stats["bad_ids"], stats["bad_ids"][:3]
    assert stats["iou_mean"] >= IOU_MEAN and stats["score_diff"] <= SCORE_TOL, stats
    # Meta's source bucket keeps stale per-frame object maps after the extraction (its frame-0 flags
    # are sliced to 2 objects): compare the conditioning frames, not their flag lists
    assert_same_states(session, doc, after_removal=True)


# Measured to diverge (IoU 0.933: one pixel of 15) on an AMD EPYC with AVX2 only, on an Intel Xeon with
# AVX-512 and VNNI, no bf16 (Ice Lake), and on an AMD EPYC with AVX512-BF16 (Zen 4), each with two threads
# and with one; not measured on the AMX class.
CLICK_TIE_MEASURED = ("avx2", "avx2/1-thread", "avx512-vnni", "avx512-vnni/1-thread", "avx512-bf16",
                      "avx512-bf16/1-thread")


@rounding_xfail("one pixel, (99, 64) of object 6's 15-pixel mask on frame 3 (responses 11 and 22), goes the other "
                "way: ours re-propagates the object to a video-resolution logit of -5.9e-6 there, Meta's is above 0 "
                "(a rounding tie; IoU 0.933 < 0.95, every other mask within bounds)",
                diverges_on=CLICK_TIE_MEASURED, measured_on=CLICK_TIE_MEASURED)
def test_clicks_refining_an_object_min_iou(clicks_replay):
    """The per-mask IoU minimum of the clicks scenario, apart from the test above: at the 448 px config
    it was a strict xfail (two pixels whose logits were within 5e-5 of 0 after the refinement went to
    another object); on the seeded checkpoint with its copied tensors told apart, one pixel of a
    15-pixel mask is such a tie on the AVX2, AVX-512 VNNI and AVX512-BF16 classes (the mark)."""
    _, pairs, _ = clicks_replay
    stats = parity(pairs)
    assert stats["iou_min"] >= IOU_MIN, stats


def test_refining_again_is_one_clear_error_where_metas_predictor_fails(bundle, sam31_reference):
    """refine_again: two refinements of an object on frame 4, tracked forward after each, match Meta. A
    third there (the frame refined and tracked through since) makes Meta's predictor, as its builder
    makes it, fail with an AssertionError (its multiplex tracker asserts iter_use_prev_mask_pred, which
    nothing sets); the scenario records that failure. Here it is one PromptError naming the frame and
    the object, and the session keeps working (nothing half-applied)."""
    from sam3track.errors import PromptError

    doc, responses = ref.load_scenario(sam31_reference.scenarios, "refine_again")
    ctx = doc["context"]
    err = ctx["refine_3_error"]
    assert err is not None and err["type"] == "AssertionError" and "iter_use_prev_mask_pred" in err["code"], err
    assert ctx["iter_use_prev_mask_pred"] is False
    pairs, _ = replay(bundle, doc, responses)
    assert len(pairs) == len(responses)
    stats = parity(pairs)
    print(stats)
    assert_parity(stats)
    # as in the clicks scenario: Meta's source bucket keeps stale per-frame object maps after the extraction
    assert_same_states(replay.session, doc, after_removal=True)
    session = replay.session
    h, w = session.source.height, session.source.width
    q = ctx["refine_3_request"]
    obj = q["obj_id"]
    points = [[x * w, y * h] for x, y in q["points"]]
    with pytest.raises(PromptError, match=rf"frame 4.*object {obj}.*iter_use_prev_mask_pred"):
        session.add_prompt(4, points=points, labels=q["point_labels"], obj_id=obj, clear_old_points=False)
    assert obj in session.object_ids
    result = session.add_prompt(2, points=points, labels=q["point_labels"], obj_id=obj)  # another frame is fine
    assert result.frame_index == 2 and obj in session.object_ids
    assert len(list(session.propagate("forward", start_frame=2))) == session.num_frames - 2


def test_a_live_stream_gives_what_the_video_session_gives(bundle, sam31_reference):
    """start_session(None), add_prompt(text=...), track(frame) frame by frame: the video session's
    results on the same 18 frames (more than the 16-frame pointer window, as a stream of unknown length
    reads it) with hotstart_delay 0, bit for bit, while the stream keeps no frame it cannot read again."""
    from sam3track.video import open_video

    doc, _ = ref.load_scenario(sam31_reference.scenarios, "text_one_bucket")
    options = {k: v["value"] for k, v in doc["overrides"].items()}
    with open_video(CLIPS / doc["clip"]["file"]) as video:
        frames = np.stack([video.read(i) for i in range(18)])
    import sam3track

    with sam3track.load(bundle, **options, hotstart_delay=0) as pred:
        session = pred.start_session(frames)
        session.add_prompt(0, text=doc["text"])
        want = list(session.propagate("forward"))
    with sam3track.load(bundle, **options) as pred:
        stream = pred.start_session(None)
        with pytest.raises(Exception, match="text prompt"):
            stream.track(frames[0])
        assert stream.add_prompt(text=doc["text"]) is None
        got = []
        for f in frames:
            got.append(stream.track(f))
            kept = [t for s in stream.tracker.states for t, r in s.frames.items() if not r.cond]
            assert len(kept) <= pred.config.max_obj_ptrs_in_encoder  # the pointer window, no more
        with pytest.raises(Exception, match="live stream"):
            list(stream.propagate())
        with pytest.raises(Exception, match="video session"):
            stream.add_prompt(points=[[10, 10]], labels=[1], obj_id=0)
    assert [r.frame_index for r in got] == [r.frame_index for r in want] == list(range(18))
    assert max(r.object_ids.size for r in want) > 0
    for a, b in zip(want, got):
        assert a.object_ids.tolist() == b.object_ids.tolist(), a.frame_index
        assert np.array_equal(a.masks, b.masks) and np.array_equal(a.scores, b.scores), a.frame_index
        assert np.array_equal(a.tracker_probs, b.tracker_probs), a.frame_index


def test_graph_calls_per_frame(bundle, sam31_reference):
    """Per frame one backbone and one grounding call, and one propagation_decoder call for all buckets
    of all tracker states (text_two_buckets: 2 buckets, one call)."""
    doc, responses = ref.load_scenario(sam31_reference.scenarios, "text_two_buckets")
    pred = _load(bundle, doc)
    session = pred.start_session(_frames(doc))
    calls = pred.backend.calls
    session.add_prompt(0, text=doc["text"])
    assert calls["backbone"] == calls["grounding_head"] == 1 and calls["propagation_decoder"] == 0
    before = dict(calls)
    results = list(session.propagate("forward", start_frame=0))
    n = len(results)
    assert n == doc["clip"]["frames"]
    assert calls["backbone"] - before["backbone"] == n
    assert calls["grounding_head"] - before["grounding_head"] == n
    # frame 0 is the prompt (conditioning) frame: its stored output is reused, no propagation there
    assert calls["propagation_decoder"] == n - 1
    state = session.tracker.states
    assert len(state) == 1 and state[0].registry.num_buckets == 2
    # memories: one call per frame for every bucket, plus one per birth frame's new state
    assert calls["memory_encoder"] - before["memory_encoder"] == n


def _checked_plan(plans: list):
    """Sam31Tracker.plan wrapped to prove the shared phases' contract (sam3track/phases.py) on every call:
    planning runs no graph and leaves the metadata, the score tables and every tracker state as they
    were; each plan is appended to ``plans``."""
    import pickle

    from sam3track.families.sam31.tracker import Sam31Tracker

    def host_state(t):
        return pickle.dumps((t.tracks, t.obj_id_to_score, t.frame_tracker_probs,
                             [(s.registry, s.frames, s.tracked) for s in t.states]))

    class NoDevice:
        def __getattr__(self, name):
            raise AssertionError(f"planning used the backend ({name})")

    original = Sam31Tracker.plan

    def checked(self, *args):
        before, backend = host_state(self), self.backend
        self.backend = NoDevice()
        try:
            plan = original(self, *args)
        finally:
            self.backend = backend
        assert host_state(self) == before, "planning changed the tracker"
        plans.append(plan)
        return plan

    return checked


@pytest.fixture(scope="module")
def hotstart_replay(bundle, sam31_reference):
    """hotstart_removal replayed once with every plan() checked (_checked_plan), read by its parity test
    and by test_planning_changes_nothing: (doc, responses, pairs, session, plans)."""
    from sam3track.families.sam31.tracker import Sam31Tracker

    plans = []
    doc, responses = ref.load_scenario(sam31_reference.scenarios, "hotstart_removal")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Sam31Tracker, "plan", _checked_plan(plans))
        pairs, _ = replay(bundle, doc, responses)
    return doc, responses, pairs, replay.session, plans


def test_planning_changes_nothing(hotstart_replay):
    """Planning decides without changing anything, on frames with hotstart removals and births alike (the
    checks run inside the replay, _checked_plan); execution then applies what it decided."""
    *_, session, plans = hotstart_replay
    assert any(p.removed_ids for p in plans) and any(p.new_ids.size for p in plans)
    assert session.tracker.tracks is plans[-1].tracks  # the last frame's metadata, installed


@pytest.fixture(scope="module")
def confident(sam31_reference, tmp_path_factory):
    """The bundle of the confident checkpoint (make_checkpoint.py --confident) and its scenarios folder."""
    from graphs.export import main

    from .export_cache import cached_export, exported

    ck, scenarios = sam31_reference.confident()
    out = tmp_path_factory.mktemp("sam31conf") / "bundle"
    argv = ["--family", "sam3.1", "--checkpoint", str(ck / "sam3.1_multiplex.pt"), "--out"]
    cached_export("sam31-confident", {"argv": argv}, out, lambda o: exported(main(argv + [str(o)])),
                  inputs=(ck / "sam3.1_multiplex.pt",))
    return out, scenarios


@pytest.mark.parametrize("name", ("recondition_forward", "recondition_both"))
def test_reconditioning_matches_meta(confident, monkeypatch, name):
    """On the confident checkpoint Meta reconditions the track on the prompt frame when the propagation
    reaches it (the recorded _recondition_masklets calls): the detection's mask merged into the track's
    where they disagree, the track's pointer, score and memory of that frame rebuilt from it. Every
    response matches, and sam3track reconditions exactly the objects on exactly the frames Meta did."""
    from sam3track.families.sam31.tracker import Sam31Tracker

    bundle, scenarios = confident
    doc, responses = ref.load_scenario(scenarios, name)
    want = [(c["frame"], c["reconditioned_obj_ids"]) for c in doc["reconditioned"] if c["reconditioned_obj_ids"]]
    assert want, f"Meta reconditioned nothing in {name}: the scenario no longer reaches the rule"
    done, original = [], Sam31Tracker.recondition

    def spy(self, frame, features, det, recondition):
        done.append((frame, sorted(recondition)))
        return original(self, frame, features, det, recondition)

    monkeypatch.setattr(Sam31Tracker, "recondition", spy)
    pairs, _ = replay(bundle, doc, responses)
    assert len(pairs) == len(responses)
    stats = parity(pairs)
    print(name, stats, done)
    assert done == want
    assert_parity(stats)
    assert_same_states(replay.session, doc)


# ------------------------------------------------------------------------------------------ units
def test_reconditioning_plan_follows_metas_filters():
    """Meta's rule on synthetic inputs: only every recondition_every_nth_frame-th frame, only kept
    confident unambiguous detections (the association's det_high_conf_and_iou), a later detection
    naming the same track replaces the earlier one in place, and the track's own probability must be
    > 0.8."""
    from types import SimpleNamespace

    from sam3track.families.sam31 import heuristics as H
    from sam3track.families.sam31.tracker import Sam31Tracker, Sam31Tracked

    stub = SimpleNamespace(config=SimpleNamespace(recondition_every_nth_frame=16))
    prev_ids = np.asarray([3, 5, 8], np.int64)
    logit = lambda p: float(np.log(p / (1 - p)))  # noqa: E731
    tracked = Sam31Tracked(prev_ids, np.zeros((3, 4, 4), np.float32),
                      np.asarray([logit(0.9), logit(0.95), logit(0.79)], np.float32))
    det = H.Detections(np.full(6, 0.9, np.float32), np.zeros((6, 4, 4), np.float32),
                       np.asarray([True, True, True, True, False, True]))
    # det 3: track 8 is not confident; det 4: not kept; det 5: not confident or ambiguous
    assoc = H.Association(np.zeros(3, bool), np.ones(3, bool), np.zeros(6, bool), np.zeros((6, 3), bool),
                          det_to_max_trk=np.asarray([1, 0, 1, 2, 0, 0]),
                          det_high_conf_and_iou=np.asarray([True, True, True, True, True, False]))
    plan = lambda frame: Sam31Tracker._recondition_plan(stub, frame, det, tracked, assoc, prev_ids)  # noqa: E731
    got = plan(32)
    assert got == {5: 2, 3: 1} and list(got) == [5, 3]  # det 2 replaced det 0 for track 5, in place
    assert plan(17) == {}
    stub.config.recondition_every_nth_frame = 0
    assert plan(32) == {}


def test_bucket_registry_fills_holes_never_and_drops_empty_buckets():
    from sam3track.families.sam31.buckets import EMPTY, REMOVED, BucketRegistry

    reg = BucketRegistry.for_objects(list(range(20)), 16)
    assert reg.num_buckets == 2 and reg.available_slots == 12
    assert reg.slots[1][:5] == [16, 17, 18, 19, EMPTY]
    reg.add([20, 21])
    assert reg.slots[1][4:6] == [20, 21] and reg.available_slots == 10
    keep = reg.remove([3])
    assert keep == [0, 1] and reg.slots[0][3] == REMOVED and reg.available_slots == 10  # a hole counts as used
    reg.add([22])
    assert reg.slots[0][3] == REMOVED and reg.positions()[22] == (1, 6)  # holes are never refilled
    keep = reg.remove([16, 17, 18, 19, 20, 21, 22])
    assert keep == [0] and reg.num_buckets == 1
    valid = reg.slot_valid()
    assert valid.shape == (1, 16) and valid[0, 3] == 0 and valid.sum() == 15
    packed = reg.pack({o: np.full(2, o, np.float32) for o in reg.obj_ids})
    assert packed.shape == (1, 16, 2) and packed[0, 3].tolist() == [0, 0]
    assert {o: v[0] for o, v in reg.unpack(packed).items()} == {o: o for o in reg.obj_ids}
    with pytest.raises(ValueError):
        reg.add(list(range(100, 120)))  # births never make a bucket in an existing state


def test_resizes_match_torch():
    import torch
    import torch.nn.functional as F

    from sam3track.families.sam31.resize import bilinear, bilinear_antialias

    rng = np.random.default_rng(0)
    # low-res masks (4F) to 14F, 16F and video sizes: F = 32 and the test config's F = 16
    for side, sizes in ((128, ((448, 448), (512, 512), (272, 640), (144, 176))), (64, ((224, 224), (256, 256), (272, 640)))):
        x = (rng.standard_normal((2, side, side)) * 8).astype(np.float32)
        for h, w in sizes:
            t = F.interpolate(torch.from_numpy(x)[:, None], size=(h, w), mode="bilinear", align_corners=False)[:, 0]
            np.testing.assert_allclose(bilinear(x, h, w), t.numpy(), rtol=0, atol=1e-5)
    binary = (rng.random((19, 512, 512)) > 0.5).astype(np.float32)  # more planes than a chunk
    for h, w in ((272, 640), (272, 176)):  # bit for bit (so the > 0.5 edge is exact)
        t = F.interpolate(torch.from_numpy(binary)[:, None], size=(h, w), mode="bilinear", align_corners=False,
                          antialias=True)[:, 0].numpy()
        assert np.array_equal(bilinear_antialias(binary, h, w), t)
    video = np.where(rng.random((2, 272, 640)) > 0.5, 1024.0, -1024.0).astype(np.float32)
    t = F.interpolate(torch.from_numpy(video)[:, None], size=(128, 128), mode="bilinear", align_corners=False,
                      antialias=True)[:, 0].numpy()
    np.testing.assert_allclose(bilinear_antialias(video, 128, 128), t, rtol=0, atol=1e-3)


@pytest.mark.xfail(strict=True, reason=(
    "the antialiased resize is bit-exact against torch's CPU kernel while each pass has up to ~7 taps "
    "(512 -> 272 rows, 512 -> 176 columns) but not for a height pass shrinking ~3.5x (512 -> 144 rows, "
    "8+ taps): about 1 in 4 values differ by an ulp (the width pass stays exact), and 1 pixel of 19 "
    "planes flips at the > 0.5 edge. Neither plain float32 adds nor one float64 accumulator match it "
    "either: the kernel's order of operations for long vertical filters is not reproduced yet. A birth's "
    "mask goes through this resize from 16F to the video size (16F = 1152 at full size), so small videos "
    "shrink it this much; the parity scenarios pass"))
def test_antialiased_resize_is_exact_for_strong_vertical_shrinks():
    import torch
    import torch.nn.functional as F

    from sam3track.families.sam31.resize import bilinear_antialias

    binary = (np.random.default_rng(0).random((19, 512, 512)) > 0.5).astype(np.float32)
    t = F.interpolate(torch.from_numpy(binary)[:, None], size=(144, 176), mode="bilinear", align_corners=False,
                      antialias=True)[:, 0].numpy()
    assert np.array_equal(bilinear_antialias(binary, 144, 176), t)


def test_detection_order_is_torchs_unstable_argsort():
    """Meta numbers new objects in the order torch's CPU argsort(descending) puts the kept detections."""
    import torch

    from sam3track.families.sam31.heuristics import std_sort

    rng = np.random.default_rng(1)
    for _ in range(50):
        keep = rng.random(int(rng.integers(1, 300))) < rng.random()
        items = [(bool(v), i) for i, v in enumerate(keep)]
        std_sort(items, lambda a, b: a[0] > b[0])
        assert [i for _, i in items] == torch.from_numpy(keep).argsort(descending=True).tolist()


def test_memory_selection_is_the_graph_contract():
    """sam3track's selection against graphs/sam31/tracker_feeds.meta_memory_selection (the documented
    contract of the propagation_decoder's pool indices)."""
    from graphs.sam31.tracker_feeds import meta_memory_selection
    from sam3track.families.sam31.buckets import BucketRegistry
    from sam3track.families.sam31.memory import FrameRecord, TrackerState, select

    rng = np.random.default_rng(2)
    for _ in range(200):
        num_frames = int(rng.integers(2, 40))
        frame = int(rng.integers(0, num_frames))
        reverse = bool(rng.random() < 0.5)
        state = TrackerState(BucketRegistry.for_objects([0], 16))
        for f in range(num_frames):
            if f != frame and rng.random() < 0.6:
                state.frames[f] = FrameRecord(cond=bool(rng.random() < 0.2), masks={}, scores={}, pointer_rows=[1],
                                              memory_rows=[1])
        sel = select(frame, state, num_frames, reverse, 7, 4, 16)
        cond = sorted(f for f, r in state.frames.items() if r.cond)
        non_cond = [f for f, r in state.frames.items() if not r.cond]
        memories, pointers, scale = meta_memory_selection(frame, cond, non_cond, num_frames, reverse)
        assert sel.memories == memories and sel.pointers == pointers and sel.scale == scale


def test_memory_selection_of_an_extracted_object():
    """An object extracted from its bucket keeps pointers but no memories (Meta's demux leaves its
    maskmem_features None, and _prepare_memory_conditioned_features skips such frames); its old
    conditioning frame stays beside a newer tracked output of the same frame and is read at distance 0."""
    from sam3track.families.sam31.buckets import BucketRegistry
    from sam3track.families.sam31.memory import FrameRecord, TrackerState, select

    def rec(cond, memory):
        return FrameRecord(cond=cond, masks={}, scores={}, pointer_rows=[1], memory_rows=[2] if memory else None)

    state = TrackerState(BucketRegistry.for_objects([0], 16))
    state.kept_cond[0] = rec(True, memory=False)  # the extracted detector-birth frame
    state.frames[0] = rec(False, memory=True)  # frame 0 tracked again since
    state.frames[1] = rec(False, memory=False)  # extracted, not tracked again
    state.frames[4] = rec(True, memory=True)  # the refinement click
    sel = select(2, state, 8, False, 7, 4, 16)
    assert sel.memories == [(4, 6), (0, 1)]  # cond 4 (t_pos -2: the last slot); non-cond 0 at d=2; no memory of 1
    assert sel.pointers == [(0, 2), (4, 2), (1, 1), (0, 2)]  # frame 0 twice: its cond and its tracked output
    assert sel.pointer_records[0] is state.kept_cond[0] and sel.pointer_records[3] is state.frames[0]
    sel = select(0, state, 8, True, 7, 4, 16)  # tracking frame 0 (backward): its kept cond output at distance 0
    assert (0, 0) in sel.pointers and sel.pointer_records[sel.pointers.index((0, 0))] is state.kept_cond[0]


def test_config_comes_from_the_manifest_and_refuses_bad_overrides(bundle):
    import json

    from sam3track.config import ConfigError
    from sam3track.families.sam31.config import Sam31Config

    manifest = json.loads((bundle / "manifest.json").read_text())
    cfg = Sam31Config.from_manifest(manifest)
    h = manifest["config"]["heuristics"]
    assert cfg.score_threshold_detection == h["score_threshold_detection"] == 0.4
    assert cfg.max_num_objects == 16 and cfg.hotstart_delay == 15 and cfg.multiplex_count == 16
    assert Sam31Config.from_manifest(manifest, max_num_objects=32).max_num_objects == 32
    with pytest.raises(ConfigError, match="unknown configuration options"):
        Sam31Config.from_manifest(manifest, mask_nms=False)
    with pytest.raises(ConfigError, match="fixed by the exported graphs"):
        Sam31Config.from_manifest(manifest, image_size=1008)
    with pytest.raises(ConfigError, match="takes a int"):
        Sam31Config.from_manifest(manifest, max_num_objects="many")


def test_bad_input_gets_one_clear_error(bundle, sam31_reference):
    import sam3track
    from sam3track.errors import ArgumentError, FrameIndexError, ObjectIdError, PromptError

    doc, _ = ref.load_scenario(sam31_reference.scenarios, "text_one_bucket")
    pred = sam3track.load(bundle)
    session = pred.start_session(_frames(doc)[:2])
    with pytest.raises(PromptError, match="no prompt"):
        next(iter(session.propagate()))
    with pytest.raises(FrameIndexError, match="out of range"):
        session.add_prompt(5, text="bike")
    with pytest.raises(PromptError, match="text="):
        session.add_prompt(0, text="  ")
    h, w = session.source.height, session.source.width
    with pytest.raises(PromptError, match="outside"):
        session.add_prompt(0, boxes=[[1, 2, w + 5, 12]])
    with pytest.raises(PromptError, match="x1 < x0"):
        session.add_prompt(0, boxes=[[1, 2, 10, 12], [20, 2, 10, 12]])
    with pytest.raises(PromptError, match="box_labels"):
        session.add_prompt(0, boxes=[[1, 2, 10, 12]], box_labels=[2])
    with pytest.raises(PromptError, match="box_labels"):
        session.add_prompt(0, text="bike", box_labels=[1])
    with pytest.raises(PromptError, match="points= alone"):
        session.add_prompt(0, boxes=[[1, 2, 10, 12]], points=[[3, 4]], labels=[1], obj_id=0)
    with pytest.raises(PromptError, match="finite"):
        session.add_prompt(0, boxes=[[1, 2, float("nan"), 12]])
    with pytest.raises(PromptError, match="outside"):
        session.add_prompt(0, points=[[1000, 2]], labels=[1])
    with pytest.raises(ObjectIdError, match="not tracked"):
        session.remove_object(3)
    with pytest.raises(ArgumentError, match="direction"):
        session.propagate("sideways")


def test_the_runtime_never_imports_torch(bundle, tmp_path):
    import subprocess
    import sys

    code = ("import sys, numpy as np, sam3track\n"
            f"p = sam3track.load({str(bundle)!r})\n"
            "s = p.start_session(np.zeros((2, 64, 64, 3), np.uint8))\n"
            "s.add_prompt(0, text='bike'); list(s.propagate())\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True,
                       env={**__import__("os").environ, "PYTHONPATH": str(repo)})
    assert p.returncode == 0, p.stderr[-2000:]


def test_removal_changes_what_bucket_mates_attend_to(bundle, sam31_reference):
    """Meta's rule: a removed object's slot becomes a hole; its bucket keeps the past memories (which
    still encode it: same rows, not recomputed), and from then on the mates decode next to an invalid
    slot and a zero pointer in that slot."""
    from sam3track.families.sam31.buckets import REMOVED
    from sam3track.families.sam31.memory import propagation_feeds, select

    doc, _ = ref.load_scenario(sam31_reference.scenarios, "remove_object")
    pred = _load(bundle, doc)
    session = pred.start_session(_frames(doc)[:3])
    session.add_prompt(0, text=doc["text"])
    list(session.propagate("forward", start_frame=0))
    (state,) = session.tracker.states
    victim = state.obj_ids[1]
    memory_rows = {f: list(r.memory_rows) for f, r in state.frames.items()}
    session.remove_object(victim)
    assert victim not in session.object_ids and state.registry.slots[0][1] == REMOVED
    assert {f: list(r.memory_rows) for f, r in state.frames.items()} == memory_rows  # past memories kept
    assert all(victim not in r.masks and victim not in r.conditioning for r in state.frames.values())
    sel = select(2, state, 3, False, 7, 4, 16)
    feeds = propagation_feeds([(state, 2, sel)])
    assert feeds["slot_valid"][0, 1] == 0 and feeds["slot_valid"][0].sum() == len(state.obj_ids)
    # the pointers the mates read still hold the victim's slot from before its removal
    b = pred.backend
    rows = [state.frames[f].pointer_rows[0] for f, _ in sel.pointers]
    held = b.to_host(session.tracker.memory.pointers.tensor, np.asarray(rows))
    assert np.abs(held[:, 1]).sum() > 0
    session.close()
    assert b.live_allocations == 0  # the pools and every staged upload are freed


def test_a_bad_sam31_manifest_is_refused_naming_the_key(bundle, tmp_path):
    import json
    import shutil

    import sam3track
    from sam3track.errors import BundleError

    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    path = copy / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "family": "sam9"}))
    with pytest.raises(BundleError, match="names model family 'sam9'"):
        sam3track.load(copy)
    broken = json.loads(json.dumps(manifest))
    del broken["config"]["heuristics"]["hotstart_delay"]
    path.write_text(json.dumps(broken))
    with pytest.raises(BundleError, match="no config.heuristics.hotstart_delay"):
        sam3track.load(copy)
    path.write_text(json.dumps(manifest))
    (copy / "mask_init.onnx").unlink()
    with pytest.raises(BundleError, match="graph mask_init is missing"):
        sam3track.load(copy)


def test_a_new_clicked_object_with_an_empty_mask_is_in_its_prompts_result(bundle, monkeypatch):
    """Meta drops empty masks from every output; the click call's own result keeps the prompted
    object (empty), so `obj_id=r.object_ids[-1]` (docs/api.md) names the object just made."""
    import sam3track
    from sam3track.families.sam31.clicks import ClickPrompts
    from sam3track.video import open_video

    with open_video(CLIPS / "bikes.mp4") as v:
        frames = np.stack([v.read(i) for i in range(2)])
    add = ClickPrompts.add_clicked_object

    def decoded(self, frame, features, obj_id, coords, labels):  # object 0 found, object 1 not
        mask = np.zeros_like(add(self, frame, features, obj_id, coords, labels))
        mask[100:150, 150:250] = obj_id == 0
        return mask

    monkeypatch.setattr(ClickPrompts, "add_clicked_object", decoded)
    with sam3track.load(bundle) as p, p.start_session(frames) as s:
        first = s.add_prompt(frame_index=1, points=[[200, 120]], labels=[1])
        assert first.object_ids.tolist() == [0] and first.masks[0].any()
        r = s.add_prompt(frame_index=1, points=[[20, 20]], labels=[1])
        assert r.object_ids.tolist() == [0, 1] and not r.masks[1].any() and r.masks[0].any()
        assert r.boxes_xyxy[1].tolist() == [0, 0, 0, 0] and len(r.prompts) == len(r.tracker_probs) == 2
        official = r.to_official()  # Meta's output format drops the empty mask, as Meta's predictor does
        assert official["out_obj_ids"].tolist() == [0] and official["out_binary_masks"].shape[0] == 1
        assert official["out_probs"].shape == (1,) and official["out_boxes_xywh"].shape == (1, 4)
        assert 1 in s.add_prompt(frame_index=1, points=[[30, 30]], obj_id=r.object_ids[-1]).object_ids
