"""The planning phase decides without mutating; the registry holds only what later frames read."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

import sam3track
from sam3track.families.sam3.config import TrackerConfig
from sam3track.families.sam3.objects import ALWAYS_OCCLUDED, ObjectRegistry, TrackedObject
from sam3track.families.sam3.planning import Detections, plan_frame

L = 16


@pytest.fixture(scope="module")
def config(tiny_bundle):
    with sam3track.load(tiny_bundle) as p:
        return p.config


def _square(y, x, size=6, value=8.0):
    m = np.full((L, L), -8.0, np.float32)
    m[y:y + size, x:x + size] = value
    return m


def _detections(*masks, scores=None, prompts=None):
    masks = np.stack(masks) if masks else np.zeros((0, L, L), np.float32)
    n = masks.shape[0]
    return Detections(masks, np.asarray(scores if scores is not None else [0.9] * n, np.float32),
                      np.zeros((n, 4), np.float32), np.asarray(prompts or [0] * n, np.int64))


def _registry(*objs):
    reg = ObjectRegistry()
    for o in objs:
        reg.add(o)
    return reg


def test_planning_mutates_nothing(config):
    reg = _registry(TrackedObject(0, prompt=0, first_frame=0, score=0.9, keep_alive=30, last_visible=0),
                    TrackedObject(1, prompt=0, first_frame=2, score=0.8, keep_alive=30, last_visible=2))
    before = copy.deepcopy(reg)
    track = np.stack([_square(0, 0), np.full((L, L), -8.0, np.float32)])
    det = _detections(_square(0, 0), _square(9, 9))
    plan = plan_frame(5, False, False, det, track, np.array([2.0, 2.0], np.float32), reg, config)
    assert reg == before  # the registry is the execution phase's to change
    assert plan.new_obj_ids == [2] and plan.births[0].first_frame == 5
    assert plan.updates[0].keep_alive == 30 and plan.updates[0].last_visible == 5
    assert plan.updates[1].last_visible == 2  # its mask is empty: not seen on frame 5


def test_objects_unseen_for_the_limit_are_retired_and_only_then(config):
    limit = 300
    cfg = dataclasses.replace(config, retire_unseen_after=limit)
    empty = np.full((1, L, L), -8.0, np.float32)
    for frame, retired in ((limit - 1, False), (limit, True)):
        reg = _registry(TrackedObject(0, prompt=0, first_frame=0, score=0.9, keep_alive=30, last_visible=0))
        plan = plan_frame(frame, False, True, _detections(), empty, np.array([-3.0], np.float32), reg, cfg)
        assert (0 in plan.retired_obj_ids) is retired
    off = dataclasses.replace(config, retire_unseen_after=0)
    reg = _registry(TrackedObject(0, prompt=0, first_frame=0, score=0.9, keep_alive=30, last_visible=0))
    plan = plan_frame(10**6, False, True, _detections(), empty, np.array([-3.0], np.float32), reg, off)
    assert not plan.retired_obj_ids


def test_an_object_removed_on_its_first_planned_frame_gives_way_even_hours_into_a_stream(config):
    """The reference's 'always occluded' (100000) stops meaning 'after any frame' after 55 minutes at
    30 fps; then the older object would give way to the removed one instead."""
    from sam3track.families.sam3.planning import NO_OBJ_LOGIT, ObjectUpdate, _suppress_by_recent_occlusion

    late = 30 * 60 * 60 * 10  # ten hours in
    reg = _registry(TrackedObject(0, prompt=0, first_frame=0, score=0.9, keep_alive=30, last_visible=late,
                                  last_occluded=late - 5),
                    TrackedObject(1, prompt=0, first_frame=late - 1, score=0.9, keep_alive=30, last_visible=late))
    masks = np.stack([_square(2, 2), _square(2, 2)])  # the same mask: they overlap completely
    updates = {o: ObjectUpdate(30, 0, reg[o].last_occluded, late, {}) for o in (0, 1)}
    _suppress_by_recent_occlusion(late, False, masks, [0, 1], {1}, reg, updates, config)
    assert np.all(masks[1] == NO_OBJ_LOGIT) and masks[0].max() > 0
    assert updates[1].last_occluded == late and updates[0].last_occluded == late - 5
    assert ALWAYS_OCCLUDED > late


def test_the_registry_keeps_no_per_frame_history(config):
    """Counters instead of frame lists, no per-frame score tables: a record's size does not grow."""
    fields = {f.name: f.type for f in dataclasses.fields(TrackedObject)}
    assert "unmatched_count" in fields and "unmatched_frames" not in fields
    assert {f.name for f in dataclasses.fields(ObjectRegistry)} == {"objects", "max_obj_id", "births_not_made"}
    reg = _registry(TrackedObject(0, prompt=0, first_frame=0, score=0.9, keep_alive=30, last_visible=0))
    track = _square(0, 0)[None]
    for frame in range(1, 200):  # a long life: the plan's update has the same size every frame
        plan = plan_frame(frame, False, True, _detections(_square(0, 0)), track, np.array([2.0], np.float32),
                          reg, config)
        u = plan.updates[0]
        reg[0].keep_alive, reg[0].unmatched_count, reg[0].last_visible = u.keep_alive, u.unmatched_count, u.last_visible
        reg[0].duplicate_of, reg[0].last_occluded = u.duplicates, u.last_occluded
    assert reg[0].duplicate_of == {} and reg[0].unmatched_count == 0 and reg[0].last_visible == 199


@pytest.mark.parametrize("prompt", [0, 1])
def test_a_detection_over_a_user_object_starts_no_new_object_whatever_its_prompt(config, prompt):
    reg = _registry(TrackedObject(0, prompt=0, first_frame=0, score=0.9, keep_alive=30, last_visible=0))
    track = np.stack([_square(0, 0)])
    user = np.stack([_square(9, 9)])  # a clicked object, not managed by the heuristics
    det = _detections(_square(9, 9), _square(9, 2, size=3), scores=[0.9, 0.9], prompts=[prompt, prompt])
    alone = plan_frame(5, False, False, det, track, np.array([2.0], np.float32), reg, config)
    beside = plan_frame(5, False, False, det, track, np.array([2.0], np.float32), reg, config, user_masks=user)
    assert alone.new_det_inds == [0, 1]
    assert beside.new_det_inds == [1]  # the one over the user object is that object
    assert beside.new_obj_ids == [1]
    full = dataclasses.replace(config, max_num_objects=2)  # user objects count against the limit
    assert plan_frame(5, False, False, det, track, np.array([2.0], np.float32), reg, full,
                      user_masks=user).new_det_inds == []
