"""A session that meets the size of its device pools survives it (issue 25, part 3).

The policy (docs/api.md, "Device memory is sized once"): births beyond what the pools hold are not
made, as the reference's max_num_objects does, with one CapacityWarning per session naming the count
and pool_objects; a frame the pools still cannot hold raises CapacityError naming the setting and
changes nothing, so the stream goes on once rows are free again. SAM 3.1's pools grow instead.

Tiny synthetic frames on the demo bundle; thresholds at 0 and NMS off make every one of the 16 queries
a detection on every frame, so a pool of 3 objects is crossed on the first frame and stays crossed.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import sam3track
from sam3track.demo import demo_bundle_path

EVERY_QUERY = dict(score_threshold_detection=0.0, new_det_thresh=0.0, mask_nms=False)
POOL_OBJECTS = 3


def _frames(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(count)]


def _stream(**options):
    """A live stream with one text prompt on the demo bundle, pools for POOL_OBJECTS objects."""
    predictor = sam3track.load(demo_bundle_path(), pool_objects=POOL_OBJECTS, **EVERY_QUERY, **options)
    session = predictor.start_session(None)
    session.add_prompt(text="person")
    return predictor, session


def _rows_match_the_bank(session) -> None:
    """Every row in use belongs to a held memory or pointer: nothing leaked, nothing freed twice."""
    held, usage = session.bank.summary(), session.memory_usage()
    assert usage["memory_rows"] == sum(len(h["spatial_memory"]) for h in held.values())
    assert usage["pointer_rows"] == sum(len(h["pointers"]) for h in held.values())


def test_a_stream_past_the_pools_goes_on_for_100_frames_with_its_ids():
    """16 detections a frame against pools for 3 objects: 3 are born, the other 13 are not made (one
    warning, with that count), and the stream runs 105 frames. The objects keep their ids; the one the
    user removes frees its rows, and the birth that takes its place gets a new id."""
    predictor, s = _stream()
    records, gone, removed_at = {}, set(), 50
    with predictor, s, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for index, frame in enumerate(_frames(105)):
            if index == removed_at:
                victim = s.object_ids[1]
                s.remove_object(victim)
                gone.add(victim)
            before = set(records) - gone
            r = s.track(frame)
            ids = s.object_ids
            assert r.frame_index == index and 0 < len(ids) <= POOL_OBJECTS
            assert not set(ids) & gone and not set(r.object_ids.tolist()) & gone  # no id comes back
            assert set(r.object_ids.tolist()) <= set(ids)
            for o in ids:
                if o in records:  # the same object under the same id as on the frame before
                    assert s.objects[o] is records[o]
                else:  # a birth: a new id above every id given so far
                    assert o > max(records, default=-1)
                    records[o] = s.objects[o]
            gone |= before - set(ids)
            _rows_match_the_bank(s)
        births_not_made = s.objects.births_not_made
    capped = [w for w in caught if issubclass(w.category, sam3track.CapacityWarning)]
    assert len(capped) == 1, [str(w.message) for w in capped]
    message = str(capped[0].message)
    assert "frame 0: 13 new objects were not made" in message and "pool_objects" in message
    assert births_not_made > 13  # later frames left births out too, without another warning
    # the ids of the first frame lived on to the removal; the freed place went to a new id
    assert sorted(records)[:POOL_OBJECTS] == [0, 1, 2] and victim == 1
    assert POOL_OBJECTS in records and records[POOL_OBJECTS].first_frame >= removed_at


def _state(session):
    """Everything a frame can change: the registry, every held entry's rows, the pools' free rows."""
    bank = session.bank
    entries = {o: {t: (e.memory_row, e.pointer_row, e.object_score)
                   for t, e in {**m.non_cond, **m.cond}.items()} for o, m in bank.objects.items()}
    return (session.stream_index, copy.deepcopy(session.objects), entries,
            bank.memories.free.copy().tolist(), bank.pointers.free.copy().tolist())


@pytest.fixture(scope="module")
def uninterrupted():
    """The results of 10 frames straight through: what a stream interrupted by a CapacityError gives."""
    predictor, s = _stream()
    with predictor, s, warnings.catch_warnings():
        warnings.simplefilter("ignore", sam3track.CapacityWarning)
        return [(r.object_ids.tolist(), r.masks.copy()) for r in map(s.track, _frames(10))]


@pytest.mark.parametrize("pool", ["pointers", "memories"])
def test_a_capacity_error_changes_nothing_and_the_stream_goes_on(pool, uninterrupted):
    """Rows taken from under the session (as objects holding more than their share would) make frame 6
    fail: CapacityError naming pool_objects, the session exactly as before the frame, and once the rows
    are back the same frame and the rest give what the uninterrupted stream gave."""
    predictor, s = _stream()
    frames = _frames(10)
    with predictor, s, warnings.catch_warnings():
        warnings.simplefilter("ignore", sam3track.CapacityWarning)
        got = [s.track(f) for f in frames[:6]]
        rows = getattr(s.bank, pool)
        taken = rows.allocate(rows.free_rows)
        before = _state(s)
        for _ in range(2):  # and again: a failed frame leaves nothing for the next try to trip on
            with pytest.raises(sam3track.CapacityError, match=r"frame 6 needs .*Nothing of this frame was "
                                                              r"applied.*pool_objects=N"):
                s.track(frames[6])
            assert _state(s) == before
        rows.release(taken)
        got += [s.track(f) for f in frames[6:]]
    assert [r.frame_index for r in got] == list(range(10))
    for r, (ids, masks) in zip(got, uninterrupted):
        assert r.object_ids.tolist() == ids and np.array_equal(r.masks, masks)


def test_births_are_planned_within_the_rows_left_so_a_frame_never_runs_out_halfway():
    """Pools with rows for only 2 births on frame 0 (memory rows taken from under the session): 2 objects
    are born and the warning names pool_objects, instead of a CapacityError from the execution phase;
    with the rows back, the stream goes on."""
    predictor, s = _stream()
    frames = _frames(6)
    with predictor, s, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        memories = s.bank.memories
        taken = memories.allocate(memories.free_rows - 2)
        s.track(frames[0])
        assert s.object_ids == [0, 1] and memories.free_rows == 0
        memories.release(taken)
        for frame in frames[1:]:
            s.track(frame)
            assert 2 <= len(s.object_ids) <= POOL_OBJECTS
            _rows_match_the_bank(s)
    capped = [str(w.message) for w in caught if issubclass(w.category, sam3track.CapacityWarning)]
    assert len(capped) == 1 and "frame 0: 14 new objects were not made" in capped[0] and "pool_objects" in capped[0]


def test_a_click_the_pools_cannot_hold_changes_nothing():
    """The prompt-call path: a new clicked object with no pointer row left is a CapacityError before
    anything changes; with the rows back the same click makes the object."""
    frames = np.stack(_frames(3))
    with sam3track.load(demo_bundle_path(), pool_objects=POOL_OBJECTS) as predictor, \
            predictor.start_session(frames) as s:
        pointers = s.bank.pointers
        taken = pointers.allocate(pointers.free_rows)
        with pytest.raises(sam3track.CapacityError, match="pointer pool.*pool_objects"):
            s.add_prompt(frame_index=1, points=[[8, 8]], labels=[1])
        assert s.object_ids == [] and not s.clicks.frames() and s.bank.summary() == {}
        pointers.release(taken)
        r = s.add_prompt(frame_index=1, points=[[8, 8]], labels=[1])
        assert s.object_ids == [0] and r.frame_index == 1


def test_planning_keeps_the_best_scoring_births_that_the_pools_hold_and_says_what_bound():
    """The planning phase alone (host arrays): without a PoolRoom only max_num_objects caps births (the
    reference's rule, unchanged); with one, the pools' objects and their free rows cap them too."""
    from sam3track.families.sam3.objects import ObjectRegistry, TrackedObject
    from sam3track.families.sam3.planning import Detections, PoolRoom, plan_frame

    with sam3track.load(demo_bundle_path()) as p:
        config = p.config
    size = config.low_res_mask_size
    masks = np.full((4, size, size), -8.0, np.float32)
    for i in range(4):  # four disjoint detections, none over the tracked object
        masks[i, 8 * i:8 * i + 6, 20:26] = 8.0
    det = Detections(masks, np.asarray([0.6, 0.9, 0.7, 0.8], np.float32), np.zeros((4, 4), np.float32),
                     np.zeros(4, np.int64))
    registry = ObjectRegistry()
    registry.add(TrackedObject(0, prompt=0, first_frame=0, score=0.9, keep_alive=30, last_visible=0))
    track = np.full((1, size, size), -8.0, np.float32)
    track[0, :6, :6] = 8.0

    def plan(room):
        return plan_frame(5, False, True, det, track, np.array([2.0], np.float32), registry, config, room=room)

    assert plan(None).new_det_inds == [0, 1, 2, 3] and plan(None).not_born is None
    assert plan(PoolRoom(objects=5, births=4)).not_born is None  # room for all: the reference's plan
    by_objects = plan(PoolRoom(objects=3, births=4))
    assert by_objects.new_det_inds == [1, 3] and by_objects.new_obj_ids == [1, 2]  # best scores first
    left_out = by_objects.not_born
    assert (left_out.count, left_out.cap, left_out.setting, left_out.by_rows) == (2, 3, "pool_objects", False)
    by_rows = plan(PoolRoom(objects=64, births=1))
    assert by_rows.new_det_inds == [1] and by_rows.not_born.count == 3 and by_rows.not_born.by_rows
    full = plan(PoolRoom(objects=1, births=4))
    assert full.new_det_inds == [] and full.births == [] and full.not_born.count == 4
    assert registry.obj_ids == [0] and registry.births_not_made == 0  # planning decided, changed nothing


def test_max_num_objects_below_the_pools_is_the_limit_the_warning_names():
    predictor, s = _stream(max_num_objects=2)
    with predictor, s, pytest.warns(sam3track.CapacityWarning, match=r"frame 0: 14 new objects.*max_num_objects"):
        s.track(_frames(1)[0])
        assert s.object_ids == [0, 1]


@pytest.mark.slow
def test_a_sam31_stream_past_max_num_objects_grows_its_pools_and_goes_on(sam31_bundle, monkeypatch):
    """SAM 3.1 does not have the defect: its pools grow (ONNX Runtime), and births over max_num_objects
    are not made (Meta's rule). Pools made with 4 rows must grow several times within 20 frames."""
    from sam3track.families.sam31 import memory

    init = memory.MultiplexMemory.__init__
    monkeypatch.setattr(memory.MultiplexMemory, "__init__",
                        lambda self, *a, rows=64, **k: init(self, *a, rows=4, **k))
    options = dict(score_threshold_detection=0.0, new_det_thresh=0.0, det_nms_thresh=1.0,
                   suppress_det_close_to_boundary=False, max_num_objects=3)
    with sam3track.load(sam31_bundle, **options) as predictor, predictor.start_session(None) as s:
        s.add_prompt(text="person")
        first = None
        for index, frame in enumerate(_frames(20)):
            r = s.track(frame)
            assert r.frame_index == index and 0 < len(s.object_ids) <= 3
            first = first or list(s.object_ids)
        assert list(s.object_ids) == first  # the same objects all along
        assert s.tracker.memory.pointers.capacity > 4
