"""The predictor's contract: API behaviour, device residency, bounded memory, and clear errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import sam3track
from sam3track.video import open_video

from .conftest import CLIPS, REPO


@pytest.fixture(scope="module")
def frames():
    with open_video(CLIPS / "bikes.mp4") as video:
        return np.stack([video.read(i) for i in range(76, 116)])


# The tiny model has random weights: "phone" and "bike" are the prompts it detects on this clip, and
# its hotstart rules remove almost every object, so they are off where a test needs visible objects.
PROMPTS = ("phone", "bike")
VISIBLE = {"hotstart_delay": 0}


@pytest.fixture(scope="module")
def predictor(tiny_bundle):
    with sam3track.load(tiny_bundle, **VISIBLE) as p:
        yield p


def _by_prompt(results, prompt):
    """frame -> {k-th object of this prompt (by id order): mask}"""
    out = []
    for r in results:
        ids = [(i, m) for i, m, p in zip(r.object_ids.tolist(), r.masks, r.prompts) if p == prompt]
        out.append(dict(ids))
    return out


def test_two_prompts_in_one_session_equal_two_one_prompt_sessions(tiny_bundle, frames):
    """Holds with match_reference_quirks=False; the reference couples prompts (see TrackerConfig)."""
    independent = sam3track.load(tiny_bundle, match_reference_quirks=False, **VISIBLE)
    with independent.start_session(frames) as both:
        for prompt in PROMPTS:
            both.add_prompt(text=prompt)
        joint = list(both.propagate())
    seen = 0
    for prompt in PROMPTS:
        with independent.start_session(frames) as one:
            one.add_prompt(text=prompt)
            single = list(one.propagate())
        a, b = _by_prompt(joint, prompt), _by_prompt(single, prompt)
        # ids differ (one counter per session); the k-th object of a prompt is the same object
        ids_a, ids_b = sorted({i for f in a for i in f}), sorted({i for f in b for i in f})
        assert len(ids_a) == len(ids_b) > 0
        rename = dict(zip(ids_a, ids_b))
        for fa, fb in zip(a, b):
            assert sorted(rename[i] for i in fa) == sorted(fb)
            for i, mask in fa.items():
                other = fb[rename[i]]
                assert (mask & other).sum() >= 0.99 * (mask | other).sum()
                seen += 1
    assert seen > 0


def test_each_prompt_encoded_once_and_one_call_per_frame_for_all_objects(tiny_bundle, frames):
    with sam3track.load(tiny_bundle, **VISIBLE) as p, p.start_session(frames[:20]) as s:
        s.add_prompt(text="phone")
        s.add_prompt(text="bike")
        assert s.add_prompt(text="phone") == 0  # the same prompt again is not encoded again
        results = list(s.propagate())
        calls = p.backend.calls
        assert calls["text_encoder"] == 2
        assert calls["backbone"] == calls["grounding_head"] == len(results) == 20
        tracked_frames = sum(1 for r in results[1:])  # objects exist from the first birth on
        assert calls["propagation_decoder"] <= tracked_frames
        assert max(len(r) for r in results) > 1  # several objects went through those single calls


def test_no_feature_map_or_memory_crosses_to_the_host(tiny_bundle, frames):
    with sam3track.load(tiny_bundle) as p, p.start_session(None) as s:
        for prompt in PROMPTS:
            s.add_prompt(text=prompt)
        cfg, backend = p.config, p.backend
        k, q, size = 2, cfg.num_queries, cfg.low_res_mask_size
        max_objects = 0
        for frame in frames:
            before = backend.transfers.snapshot()
            backend.transfer_log.clear()
            result = s.track(frame)
            n = len(s.object_ids)
            max_objects = max(max_objects, n)
            copied = [shape for direction, shape in backend.transfer_log if direction == "to_host"]
            # what may come back: scores and boxes [K, Q(, 4)], presence [K, 1], one detection mask at a
            # time [1, L, L], the tracker's masks [N, 1, L, L] and object scores [N, 1]
            for shape in copied:
                assert shape[-2:] == (size, size) or int(np.prod(shape)) <= k * q * 4, shape
                assert cfg.memory_dim not in shape[1:] and cfg.hidden_dim not in shape[1:], shape
            spent = backend.transfers.since(before)
            bound = 4 * (6 * k * q + k) + 4 * (size * size + 1) * (k * q + 2 * n + 2 * len(result))
            assert spent.device_to_host_bytes <= bound
        assert max_objects > 1


@pytest.mark.slow
def test_memory_stays_bounded_on_a_long_run(tiny_bundle):
    """Per object: conditioning frames within the cap, spatial memory only for those and the recent
    window, pointers only for those and the pointer window; the pools hold exactly that."""
    with sam3track.load(tiny_bundle, **VISIBLE) as p, p.start_session(CLIPS / "bikes.mp4") as s:
        for prompt in PROMPTS:
            s.add_prompt(text=prompt)
        cfg = p.config
        peak_objects = 0
        for r in s.propagate(start_frame=0, max_frames=120):
            held = s.bank.summary()
            peak_objects = max(peak_objects, len(held))
            for obj_id, h in held.items():
                cond = set(h["conditioning"])
                assert len(cond) <= cfg.max_conditioning_frames
                recent = set(h["spatial_memory"]) - cond
                # what the next frame reads, and one frame more: what a click on this frame reads
                assert all(0 <= r.frame_index - t < cfg.num_maskmem for t in recent), (obj_id, recent, r.frame_index)
                assert all(0 <= r.frame_index - t < cfg.max_object_pointers_in_encoder
                           for t in set(h["pointers"]) - cond)
            usage = s.memory_usage()
            assert usage["memory_rows"] == sum(len(h["spatial_memory"]) for h in held.values())
            assert usage["pointer_rows"] == sum(len(h["pointers"]) for h in held.values())
        assert peak_objects > 0


def test_both_directions_and_backward(predictor, frames):
    with predictor.start_session(frames) as s:
        s.add_prompt(text="bike")
        results = list(s.propagate(direction="both", start_frame=20))
    order = [r.frame_index for r in results]
    assert order == list(range(20, 40)) + list(range(19, -1, -1))
    with predictor.start_session(frames) as s:
        s.add_prompt(text="bike")
        forward = list(s.propagate(start_frame=20))
    assert [len(r) for r in results[:20]] == [len(r) for r in forward]
    assert any(len(r) for r in results[20:]), "the backward half tracked nothing"
    with predictor.start_session(frames) as s:
        s.add_prompt(text="bike")
        backward = list(s.propagate(direction="backward", start_frame=10, max_frames=5))
    assert [r.frame_index for r in backward] == [10, 9, 8, 7, 6]


def test_remove_reset_close(predictor, frames):
    s = predictor.start_session(frames)
    s.add_prompt(text="bike")
    first = list(s.propagate(max_frames=30))
    assert s.object_ids
    victim = s.object_ids[0]
    s.remove_object(victim)
    assert victim not in s.object_ids
    later = list(s.propagate(start_frame=30, max_frames=5))
    assert all(victim not in r.object_ids for r in later)
    with pytest.raises(sam3track.ObjectIdError, match=f"object {victim} is not tracked"):
        s.remove_object(victim)
    rows_before = s.memory_usage()["memory_rows"]
    survivor_rows = sum(len(h["spatial_memory"]) for h in s.bank.summary().values())
    assert rows_before == survivor_rows  # the removed object's rows went back to the pool
    s.reset()
    assert s.object_ids == [] and s.bank.summary() == {} and s.prompts == []  # reset clears prompts too
    with pytest.raises(sam3track.PromptError, match="no prompt"):
        next(s.propagate(max_frames=1))
    s.add_prompt(text="bike")
    again = list(s.propagate(max_frames=30))  # the same prompt again finds the same objects
    assert [len(r) for r in again] == [len(r) for r in first]
    s.close()
    s.close()  # idempotent
    with pytest.raises(sam3track.SessionClosedError):
        s.add_prompt(text="dog")


def test_closing_the_predictor_closes_its_sessions(tiny_bundle, frames):
    p = sam3track.load(tiny_bundle)
    s = p.start_session(frames[:3])
    s.add_prompt(text="bike")
    p.close()
    p.close()
    with pytest.raises(sam3track.SessionClosedError, match="predictor of this session was closed"):
        list(s.propagate())
    with pytest.raises(sam3track.SessionClosedError):
        p.start_session(frames[:3])


def test_runtime_never_imports_torch(tiny_bundle):
    code = textwrap.dedent(f"""
        import sys, sam3track
        p = sam3track.load({str(tiny_bundle)!r})
        with p.start_session({str(CLIPS / 'bikes.mp4')!r}) as s:
            s.add_prompt(text="bike")
            n = sum(1 for _ in s.propagate(start_frame=76, max_frames=20))
        import sam3track.cli, sam3track.render, sam3track.sinks
        assert n == 20
        bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.") or m == "transformers")
        assert not bad, bad
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ------------------------------------------------------------------------------------- bad input
def test_bad_video_inputs(predictor, tmp_path):
    with pytest.raises(sam3track.VideoError, match="nope.mp4"):
        predictor.start_session(tmp_path / "nope.mp4")
    fake = tmp_path / "fake.mp4"
    fake.write_text("not a video")
    with pytest.raises(sam3track.VideoError, match="fake.mp4"):
        predictor.start_session(fake)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(sam3track.VideoError, match="empty"):
        predictor.start_session(empty)


def test_bad_session_inputs_leave_the_session_usable(predictor, frames):
    with predictor.start_session(frames[:5]) as s:
        with pytest.raises(sam3track.PromptError, match="empty"):
            s.add_prompt(text="   ")
        with pytest.raises(sam3track.PromptError, match="no prompt"):
            list(s.propagate())
        with pytest.raises(sam3track.FrameIndexError, match="frame index 99 is out of range"):
            s.add_prompt(frame_index=99, text="bike")
        s.add_prompt(text="bike")
        with pytest.raises(sam3track.FrameIndexError, match="start_frame -1 is out of range"):
            list(s.propagate(start_frame=-1))
        with pytest.raises(sam3track.ObjectIdError, match="object 12345"):
            s.remove_object(12345)
        assert len(list(s.propagate())) == 5  # still usable


def test_bad_bundles(tiny_bundle, tmp_path):
    def copy():
        target = tmp_path / f"b{len(list(tmp_path.iterdir()))}"
        shutil.copytree(tiny_bundle, target, ignore=shutil.ignore_patterns("source"))
        return target

    with pytest.raises(sam3track.BundleError, match="does not exist"):
        sam3track.load(tmp_path / "missing")
    b = copy()
    (b / "mask_init.onnx").unlink()
    with pytest.raises(sam3track.BundleError, match="graph mask_init is missing"):
        sam3track.load(b)
    b = copy()
    with open(b / "propagation_decoder.onnx", "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    with pytest.raises(sam3track.BundleError, match="checksum mismatch .*propagation_decoder.onnx"):
        sam3track.load(b)
    b = copy()
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["format_version"] = 99
    (b / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(sam3track.BundleError, match="format 99, newer"):
        sam3track.load(b)


def _stream_and_offline(tiny_bundle, frames):
    p = sam3track.load(tiny_bundle, **VISIBLE)
    with p.start_session(frames) as offline, p.start_session(None) as stream:
        for prompt in PROMPTS:
            offline.add_prompt(text=prompt)
            stream.add_prompt(text=prompt)
        a, births = [], {}
        for r in offline.propagate():  # hotstart_delay 0: each result comes right after its frame
            a.append(r)
            births.update({o: r.frame_index for o in range(len(births), offline.objects.max_obj_id + 1)})
        b = [stream.track(f) for f in frames]
        return a, b, births


@pytest.mark.slow
def test_streaming_equals_offline_where_the_reference_allows(tiny_bundle, frames):
    """Without hotstart (which needs future frames), track() and propagate() agree once the object
    pointers are normalised alike: the reference normalises by min(frames seen, 16) when streaming and
    min(video length, 16) offline, so objects born in the first 15 frames are tracked differently."""
    lead_in = np.full((16,) + frames.shape[1:], 128, np.uint8)  # a grey start: nothing is detected
    offline, stream, births = _stream_and_offline(tiny_bundle, np.concatenate([lead_in, frames[:24]]))
    assert births and min(births.values()) >= 15
    assert [r.object_ids.tolist() for r in offline] == [r.object_ids.tolist() for r in stream]
    assert all(np.array_equal(a.masks, b.masks) for a, b in zip(offline, stream))

    black = np.zeros((16,) + frames.shape[1:], np.uint8)  # the tiny model detects on black: born at 0
    offline, stream, births = _stream_and_offline(tiny_bundle, np.concatenate([black, frames[:24]]))
    first = min(births.values())
    assert first < 15
    # identical up to the first birth; after it, only the pointer normalisation differs between them
    same = [np.array_equal(a.masks, b.masks) and a.object_ids.tolist() == b.object_ids.tolist()
            for a, b in zip(offline, stream)]
    assert all(same[:first + 1]) and not all(same[first + 1:])
