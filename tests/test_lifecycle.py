"""Closing releases everything; nothing runs after close; generators do not outlive their session."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import sam3track
from sam3track.video import open_video

from .conftest import CLIPS


@pytest.fixture(scope="module")
def frames():
    with open_video(CLIPS / "bikes.mp4") as video:
        return np.stack([video.read(i) for i in range(76, 100)])


def test_close_releases_sessions_pools_sources_and_graphs(tiny_bundle, frames):
    p = sam3track.load(tiny_bundle, hotstart_delay=0)
    s = p.start_session(frames)
    for prompt in ("bike", "phone"):
        s.add_prompt(text=prompt)
    running = s.propagate()
    for _ in range(12):
        next(running)
    assert s.object_ids, "the test needs tracked objects, so that pools hold rows"
    assert p.backend.live_allocations >= 3  # two pools and the text pool, at least
    # a graph the load deferred and no frame ran has no session to watch (test_load_cache.py)
    watched = {f"graph {name}": weakref.ref(graph.session) for name, graph in p.graphs.items() if graph.loaded}
    assert {"backbone", "grounding_head", "propagation_decoder"} <= {n for n, g in p.graphs.items() if g.loaded}
    watched["memory pool"] = weakref.ref(s.bank.memories.tensor.handle[0])
    watched["pointer pool"] = weakref.ref(s.bank.pointers.tensor.handle[0])
    watched["source"] = weakref.ref(s.source)
    p.close()
    gc.collect()
    assert p.backend.live_allocations == 0
    alive = [what for what, ref in watched.items() if ref() is not None and not getattr(ref(), "freed", False)]
    # the source object lives while the session does; it must be closed
    assert alive in ([], ["source"]), alive
    assert s.closed
    with pytest.raises(sam3track.SessionClosedError, match="predictor of this session was closed"):
        next(running)  # a suspended propagate() does not keep running on freed memory
    for call in (lambda: s.add_prompt(text="dog"), lambda: list(s.propagate()), lambda: s.remove_object(0),
                 lambda: s.reset(), lambda: s.frame(0), lambda: p.start_session(frames)):
        with pytest.raises(sam3track.SessionClosedError):
            call()
    with pytest.raises(sam3track.BackendError, match="closed"):
        p.backend.upload(np.zeros(3, np.float32))
    del running, s
    gc.collect()
    assert watched["source"]() is None


def test_closing_a_session_frees_its_pools_and_closes_an_owned_source(tiny_bundle, frames, tmp_path):
    with sam3track.load(tiny_bundle, hotstart_delay=0) as p:
        baseline = p.backend.live_allocations
        s = p.start_session(CLIPS / "bikes.mp4")
        s.add_prompt(frame_index=80, text="bike")
        results = s.propagate(max_frames=6)
        assert [r.frame_index for r in results] == list(range(80, 86))  # starts at the prompted frame
        assert p.backend.live_allocations > baseline
        s.close()
        gc.collect()
        assert p.backend.live_allocations == baseline
        assert s.source._closed  # a path given to start_session is the session's to close
        shared = open_video(CLIPS / "bikes.mp4")
        with p.start_session(shared) as s2:
            s2.add_prompt(text="bike")
        assert not shared._closed  # a FrameSource passed in stays the caller's
        shared.close()


def test_a_suspended_propagate_stops_when_its_session_closes(tiny_bundle, frames):
    with sam3track.load(tiny_bundle, hotstart_delay=0) as p:
        s = p.start_session(frames)
        s.add_prompt(text="bike")
        running = s.propagate()
        next(running)
        s.close()
        with pytest.raises(sam3track.SessionClosedError, match="session is closed"):
            next(running)


def test_two_propagate_generators_on_one_session_are_refused(tiny_bundle, frames):
    with sam3track.load(tiny_bundle, hotstart_delay=0) as p, p.start_session(frames[:8]) as s:
        s.add_prompt(text="bike")
        first = s.propagate()
        next(first)
        second = s.propagate(direction="backward")
        with pytest.raises(sam3track.SessionBusyError, match="still running"):
            next(second)
        with pytest.raises(sam3track.SessionBusyError):
            s.reset()
        assert len(list(first)) == 7  # the first one is undisturbed
        first.close()
        assert [r.frame_index for r in s.propagate(direction="backward", start_frame=7, max_frames=3)] == [7, 6, 5]
        abandoned = s.propagate()
        next(abandoned)
        abandoned.close()  # closing a generator frees the session for the next call
        assert len(list(s.propagate(max_frames=2))) == 2


def test_remove_object_mid_propagation_hides_it_from_results_still_held_back(tiny_bundle, frames):
    with sam3track.load(tiny_bundle, hotstart_delay=5) as p, p.start_session(frames) as s:
        s.add_prompt(text="bike")
        running = s.propagate()
        seen = [next(running) for _ in range(8)]
        held = [o for o in s._held if o.masks]
        victim = next(i for o in held for i in o.masks)  # computed, not yet shown
        s.remove_object(victim)
        rest = list(running)
        assert all(victim not in r.object_ids for r in rest)
        assert victim not in s.object_ids
        assert len(seen) + len(rest) == len(frames)


def test_closing_an_onnxruntime_backend_hands_freed_heap_back(tiny_bundle, monkeypatch):
    """glibc keeps freed heap pages for the life of the process: a full-size predictor loaded without
    a cache entry left 3.5 GB resident after close() (docs/speed.md, "Memory at full size"). close()
    hands them back (malloc_trim), after the sessions are released."""
    from sam3track.backends import onnxruntime as ort_backend
    from sam3track.backends import ort_sessions

    calls = []
    monkeypatch.setattr(ort_backend, "return_freed_heap", lambda: calls.append(p.backend.closed))
    p = sam3track.load(tiny_bundle, backend="onnxruntime")
    assert calls == []
    p.close()
    assert calls == [True]
    ort_sessions._MALLOC_TRIM = None
    monkeypatch.undo()
    ort_sessions.return_freed_heap()  # the real call, where there is one
    import platform

    if platform.libc_ver()[0] == "glibc":
        assert callable(ort_sessions._MALLOC_TRIM)
    else:
        assert ort_sessions._MALLOC_TRIM is False
