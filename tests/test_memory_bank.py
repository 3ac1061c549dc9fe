"""Device pools and the memory bank's keeping rules, on the ONNX Runtime backend; re-propagation."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import sam3track
from sam3track.backends.onnxruntime import OnnxRuntimeBackend
from sam3track.families.sam3.memory import MemoryBank, MemoryEntry
from sam3track.memory_bank import ZERO_ROW, DevicePool
from sam3track.video import open_video

from .conftest import CLIPS
from .test_parity import record_events, synthetic_frames


@pytest.fixture()
def backend():
    b = OnnxRuntimeBackend()
    yield b
    b.close()


def _fill(backend, pool, rows, value):
    target = pool.target(rows)
    backend.copy(backend.upload(np.full(target.shape, value, pool.dtype)), target)
    pool.commit(rows, target)


def test_pools_start_zeroed_and_keep_a_zero_row(backend):
    pool = DevicePool(backend, (3,), capacity=4)
    assert np.array_equal(backend.to_host(pool.tensor), np.zeros((4, 3), np.float32))
    rows = pool.allocate(3)
    assert ZERO_ROW not in rows.tolist() and pool.used == 3
    _fill(backend, pool, rows, 7.0)
    host = backend.to_host(pool.tensor)
    assert np.all(host[ZERO_ROW] == 0) and np.all(host[rows] == 7)
    pool.release([ZERO_ROW])  # never handed out, never freed
    assert pool.used == 3


def test_allocation_needs_no_contiguous_run_and_the_capacity_never_changes(backend):
    pool = DevicePool(backend, (2,), capacity=24)
    tensor = pool.tensor
    held = list(pool.allocate(7))
    rng = np.random.default_rng(0)
    for step in range(300):  # churn: free random rows, allocate batches into the holes
        for r in rng.choice(held, size=min(len(held), int(rng.integers(0, 4))), replace=False):
            held.remove(r)
            pool.release([r])
        count = int(rng.integers(1, 5))
        if pool.used + count > 23:
            with pytest.raises(sam3track.CapacityError, match="pool_objects"):
                pool.allocate(count)
            continue
        batch = pool.allocate(count)
        _fill(backend, pool, batch, float(step))
        held += batch.tolist()
        assert len(set(held)) == len(held) == pool.used
    assert pool.tensor is tensor and pool.capacity == 24  # fixed: a static-shape graph reads it
    host = backend.to_host(pool.tensor)
    assert np.all(host[ZERO_ROW] == 0)


def test_a_full_pool_names_the_setting_and_takes_rows_again_once_released(backend):
    pool = DevicePool(backend, (2,), capacity=4, name="memory pool")
    rows = pool.allocate(3)
    with pytest.raises(sam3track.CapacityError, match=r"memory pool is full: 3 of its 3 rows.*pool_objects"):
        pool.allocate(1)
    assert pool.used == 3  # the failed call took nothing
    pool.release(rows[:1])
    assert pool.allocate(1).tolist() == rows[:1].tolist()


def test_padded_batches_commit_only_their_real_rows(backend):
    pool = DevicePool(backend, (2,), capacity=8)
    rows = pool.allocate(3)  # consecutive, but the call runs at a gear of 4: scratch + scatter
    target = pool.target(rows, size=4)
    assert target.shape == (4, 2)
    backend.copy(backend.upload(np.arange(8, dtype=np.float32).reshape(4, 2)), target)
    pool.commit(rows, target)
    host = backend.to_host(pool.tensor)
    assert np.array_equal(host[rows], np.arange(6, dtype=np.float32).reshape(3, 2))
    assert np.all(host[4:] == 0) and np.all(host[ZERO_ROW] == 0)  # the padding row went nowhere


def test_scattered_rows_receive_exactly_their_batch(backend):
    pool = DevicePool(backend, (2,), capacity=8)
    rows = pool.allocate(6)
    pool.release([rows[1], rows[3], rows[4]])
    batch = pool.allocate(3)
    assert not np.all(np.diff(batch) == 1)  # not one run: the scatter path
    target = pool.target(batch)
    backend.copy(backend.upload(np.arange(6, dtype=np.float32).reshape(3, 2)), target)
    pool.commit(batch, target)
    host = backend.to_host(pool.tensor)
    assert np.array_equal(host[batch], np.arange(6, dtype=np.float32).reshape(3, 2))


def test_a_batch_takes_a_free_run_when_there_is_one(backend):
    """Rows freed here and there leave holes; a batch that fits in a run of free rows goes there (its
    graph writes it in place, no scatter), a single row fills the lowest hole, and without a long
    enough run the lowest free rows are taken."""
    pool = DevicePool(backend, (2,), capacity=12)
    rows = pool.allocate(8)  # 1..8
    pool.release([rows[1], rows[3], rows[4]])  # free: 2, 4, 5, 9, 10, 11
    assert pool.allocate(3).tolist() == [9, 10, 11]
    assert pool.target(np.arange(9, 12)).shape == (3, 2)
    assert pool.allocate(2).tolist() == [4, 5]
    assert pool.allocate(1).tolist() == [2]
    pool.release([1, 3, 7])
    assert pool.allocate(2).tolist() == [1, 3]  # no run of two: lowest first, scattered
    assert pool.used == 10


def test_a_view_taken_before_a_reset_cannot_be_written(backend):
    pool = DevicePool(backend, (2,), capacity=4)
    rows = pool.allocate(1)
    stale = pool.target(rows)
    pool.reset()  # a fresh zeroed buffer: the old one is freed
    with pytest.raises(sam3track.BackendError, match="used after it was freed"):
        backend.copy(backend.upload(np.ones((1, 2), np.float32)), stale)


def test_to_host_returns_owned_arrays_and_gathers_rows_in_one_copy(backend):
    tensor = backend.upload(np.arange(12, dtype=np.float32).reshape(6, 2))
    whole = backend.to_host(tensor)
    whole[:] = -1
    assert backend.to_host(tensor)[0, 1] == 1.0  # writing the copy changed nothing on the device
    assert whole.flags.owndata or whole.base is None or not np.shares_memory(whole, backend.to_host(tensor))
    before = backend.transfers.device_to_host
    picked = backend.to_host(tensor, rows=np.array([5, 0, 3]))
    assert backend.transfers.device_to_host == before + 1
    assert np.array_equal(picked, np.array([[10, 11], [0, 1], [6, 7]], np.float32))


def _config(**overrides):
    values = dict(feature_grid=2, memory_dim=2, hidden_dim=4, num_maskmem=7, max_cond_frame_num=4,
                  max_object_pointers_in_encoder=16, max_conditioning_frames=0, memory_store_ram_mib=1,
                  memory_store_disk_mib=1)
    values.update(overrides)
    return SimpleNamespace(**values)


def _bank(backend, config, rows=512):
    return MemoryBank(backend, config, memory_rows=rows, pointer_rows=rows)


def _add(bank, obj, frame, cond):
    row = bank.pointers.allocate(1)[0]
    bank.add(obj, frame, MemoryEntry(int(row), 1.0), cond=cond)
    bank.set_memory_rows([obj], frame, bank.memories.allocate(1))


def test_conditioning_memories_survive_passes_in_both_directions(backend):
    bank = _bank(backend, _config())
    _add(bank, 0, 0, cond=True)
    for frame in range(1, 100):  # forward, reconditioned every 16 frames
        _add(bank, 0, frame, cond=False)
        if frame % 16 == 0:
            bank.promote_to_cond(0, frame)
        bank.evict(frame, reverse=False, streaming=False)
    for frame in range(99, -1, -1):  # then backward over the same frames
        bank.query([0], frame, reverse=True, num_frames=100)  # raises if it selects a freed row
        if not bank.has_cond(0, frame):
            _add(bank, 0, frame, cond=False)
        bank.evict(frame, reverse=True, streaming=False)
    summary = bank.summary()[0]
    assert summary["conditioning"] == [0, 16, 32, 48, 64, 80, 96]
    assert set(summary["conditioning"]) <= set(summary["spatial_memory"])
    with pytest.raises(sam3track.Sam3TrackError, match="conditioning memory of frame 16 would be replaced"):
        bank.add(0, 16, MemoryEntry(1, 0.0), cond=False)


def test_keep_all_conditioning_frames_means_all(backend):
    bank = _bank(backend, _config(max_cond_frame_num=-1))
    for frame in range(0, 200, 16):
        _add(bank, 0, frame, cond=True)
        bank.evict(frame, reverse=False, streaming=True)
    assert bank.summary()[0]["spatial_memory"] == list(range(0, 200, 16))


def test_streams_keep_what_can_still_be_selected_and_cap_conditioning_frames(backend):
    bank = _bank(backend, _config(max_conditioning_frames=5))
    for frame in range(0, 400):
        _add(bank, 0, frame, cond=frame % 16 == 0)
        bank.evict(frame, reverse=False, streaming=True)
        q = bank.query([0], frame + 1, reverse=False, num_frames=None)
        assert q.memory_valid.sum() <= 4 + 6 and q.pointer_valid.sum() <= 5 + 15
    held = bank.summary()[0]
    assert held["conditioning"] == [320, 336, 352, 368, 384]  # the farthest went first
    assert held["spatial_memory"] == [336, 352, 368, 384] + list(range(394, 400))  # 4 newest cond + 6 recent
    assert bank.memories.used == len(held["spatial_memory"])
    assert bank.pointers.used == len(held["pointers"]) == 5 + 15


@pytest.mark.slow
def test_forward_backward_forward_on_a_session_keeps_conditioning_intact(tiny_bundle):
    """Three propagate() calls over 90 frames with reconditioning: no error, no conditioning frame lost,
    the conditioning memories still on the device afterwards."""
    with open_video(CLIPS / "bikes.mp4") as video:
        shot = [video.read(i) for i in range(76, 121)]
    frames = np.stack(shot + shot[::-1])  # 90 frames, a ping-pong of one continuous shot
    with sam3track.load(tiny_bundle, hotstart_delay=0) as p, p.start_session(frames) as s:
        s.add_prompt(text="bike")
        s.add_prompt(text="phone")
        list(s.propagate())
        first = {o: set(v["conditioning"]) for o, v in s.bank.summary().items()}
        reconditioned = {t for frames_ in first.values() for t in frames_ if t % 16 == 0 and t > 0}
        assert reconditioned, f"no reconditioning happened: {first}"
        list(s.propagate(direction="backward", start_frame=len(frames) - 1))
        list(s.propagate())
        after = s.bank.summary()
        for obj_id, cond in first.items():
            if obj_id in after:
                assert cond <= set(after[obj_id]["conditioning"])
                assert set(after[obj_id]["conditioning"]) <= set(after[obj_id]["spatial_memory"])




# ------------------------------------------------------------------ the host store (issue 31)

def test_the_host_store_gives_values_back_bit_for_bit_from_memory_and_disk():
    from sam3track.memory_store import HostStore

    rng = np.random.default_rng(0)
    bf16 = (rng.standard_normal((6, 4)).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
    plain = rng.standard_normal(5).astype(np.float32)  # not bf16-exact: kept whole
    store = HostStore(ram_bytes=bf16.nbytes // 2 + plain.nbytes, disk_bytes=10 ** 6)
    a, b, c = ("m", 1, 0), ("p", 1, 0), ("m", 2, 7)
    store.put(a, bf16)
    assert store.ram_bytes == bf16.nbytes // 2  # 16 bits per value
    store.put(b, plain)
    store.put(c, bf16 * 2)  # over the RAM cap: the oldest (a) goes to the spill file
    assert store.disk_bytes == bf16.nbytes // 2 and store.ram_bytes <= store.ram_cap and len(store) == 3
    for key, want in ((a, bf16), (b, plain), (c, bf16 * 2)):
        got = store.get(key)
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got.view(np.uint32),
                                                                                      want.view(np.uint32))
        got += 1  # a copy: the store's value is untouched
        assert np.array_equal(store.get(key), want)
    store.discard(a)
    assert store.get(a) is None and store.disk_bytes == 0 and a not in store and len(store) == 2
    store.put(("m", 3, 1), bf16 * 4)
    store.put(("m", 3, 2), bf16 * 8)  # b, c and (m, 3, 1) spill: c into the hole a left
    assert store._end == store.disk_bytes == plain.nbytes + bf16.nbytes
    store.discard_object(3)
    assert ("m", 3, 2) not in store and np.array_equal(store.get(c), bf16 * 2) and len(store) == 2
    spill = store._file
    store.close()
    assert spill.closed and len(store) == 0


def test_the_host_store_drops_the_oldest_beyond_its_disk_cap():
    from sam3track.memory_store import HostStore

    row = np.ones(256, np.float32)  # bf16-exact: 512 bytes kept
    store = HostStore(ram_bytes=0, disk_bytes=3 * 512)
    order = [("m", 1, 5), ("p", 2, 0), ("m", 1, 2), ("m", 2, 9), ("m", 1, 0)]  # put order, not frame order
    for k, key in enumerate(order):
        store.put(key, row * k)
    assert [key for key in order if key in store] == order[2:] and store.dropped == 2
    assert store.ram_bytes == 0 and store.disk_bytes == 3 * 512 and store._end == 3 * 512  # holes reused
    assert np.array_equal(store.get(order[4]), row * 4)
    off = HostStore(0, 0)
    off.put(("m", 1, 0), row)
    assert not off.enabled and ("m", 1, 0) not in off and off._file is None
    store.close()


def test_the_host_store_keeps_a_few_bytes_of_bookkeeping_per_entry():
    """A long clip's index is arrays over frames, not an object per entry: 10,000 frames x 2 objects x 2
    kinds, all on disk, take under 50 bytes of host memory each beyond the rows (which are on disk)."""
    import tracemalloc

    from sam3track.memory_store import HostStore

    row = np.ones(8, np.float32)
    store = HostStore(ram_bytes=64, disk_bytes=10 ** 8)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for frame in range(10_000):
        for obj in (1, 2):
            store.put(("m", obj, frame), row)
            store.put(("p", obj, frame), row)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(store) == 40_000 and store.disk_bytes > 0
    assert grown / 40_000 < 50, grown / 40_000
    store.close()


def test_a_session_spills_to_a_file_it_closes_on_close(tiny_bundle):
    """With no host memory for it, what left the device is all in the spill file, closed (so gone: it
    has no name) once the session closes; the pools hold one window, whatever the clip's length."""
    frames = synthetic_frames()[:24]
    with sam3track.load(tiny_bundle, memory_store_ram_mib=0) as p:
        s = p.start_session(frames)
        s.add_prompt(frame_index=0, points=[[35, 60]], obj_id=1)
        list(s.propagate())
        store = s.bank.store
        spill = store._file
        assert store.ram_bytes == 0 and store.disk_bytes > 0 and not spill.closed
        held = s.bank.summary()[1]
        assert held["spatial_memory"] == [0] + list(range(17, 24)) and held["pointers"] == [0] + list(range(8, 24))
        assert ("m", 1, 5) in store and ("p", 1, 5) in store and ("m", 1, 20) not in store
        s.add_prompt(frame_index=8, points=[[50, 60]], obj_id=1)  # reads frames 2..7 back from the store
        assert set(range(2, 8)) <= set(s.bank.summary()[1]["spatial_memory"])
        s.close()
        assert spill.closed and len(store) == 0


def test_a_one_pass_session_keeps_no_history_and_the_cli_job_asks_for_one(tiny_bundle, tmp_path):
    """keep_history=False (what `sam3track track` and batch ask for: one pass, never back) stores
    nothing of the frames it leaves, and tracks the same masks as a session that keeps them."""
    import io

    from sam3track.jobs.track import TrackJob, run_track

    frames = synthetic_frames()[:12]
    with sam3track.load(tiny_bundle) as p:
        masks = {}
        for keep in (True, False):
            with p.start_session(frames, keep_history=keep) as s:
                s.add_prompt(frame_index=0, points=[[35, 60]], obj_id=1)
                masks[keep] = [r.masks for r in s.propagate()]
                assert s.bank.store.enabled is keep and (len(s.bank.store) > 0) is keep
        assert all(np.array_equal(a, b) for a, b in zip(masks[True], masks[False]))

        asked = []

        class Recording:  # the loaded predictor the job is handed, recording how it opens its session
            def __getattr__(self, name):
                return getattr(p, name)

            def start_session(self, *args, **kwargs):
                asked.append(kwargs.get("keep_history", True))
                return p.start_session(*args, **kwargs)

        video = tmp_path / "clip"
        video.mkdir()
        from PIL import Image

        for i, f in enumerate(frames[:3]):
            Image.fromarray(f).save(video / f"{i:05d}.png")
        job = TrackJob(video=video, bundle=tiny_bundle, prompts=["car"], output=tmp_path / "masks.mp4")
        err = io.StringIO()
        assert run_track(job, stdout=io.StringIO(), stderr=err, predictor=Recording()) == 0, err.getvalue()
        assert asked == [False]


def test_a_frame_with_births_encodes_each_memory_once(tiny_bundle, monkeypatch):
    """On a frame with births the reference re-encodes the tracked objects' memories from their thresholded
    masks (with match_reference_quirks); the planned memories those replace are not made at all (issue 29, work
    avoided: the parity tests hold the masks to the reference's). Every object's memory of a frame is
    encoded once, births and re-encoded objects in one binarized call."""
    from sam3track.families.sam3.frame_loop import FrameLoop

    calls = []
    encode = FrameLoop.encode_memory

    def spy(self, features, obj_ids, frame, logits, scores, binarize, via_image=False):
        calls.append((frame, list(obj_ids), bool(np.all(binarize))))
        return encode(self, features, obj_ids, frame, logits, scores, binarize, via_image)

    monkeypatch.setattr(FrameLoop, "encode_memory", spy)
    frames = synthetic_frames()[:26]  # the second block is born on frame 25
    with sam3track.load(tiny_bundle, hotstart_delay=0, new_det_thresh=0.85, match_reference_quirks=True) as p, \
            p.start_session(frames) as s:
        events = record_events(s)
        s.add_prompt(text="bike")
        s.add_prompt(text="person")
        list(s.propagate())
        born = events["births"]
    per_frame: dict[int, list[int]] = {}
    for frame, ids, _ in calls:
        per_frame.setdefault(frame, []).extend(ids)
    assert all(len(ids) == len(set(ids)) for ids in per_frame.values()), per_frame
    # a frame with births while older objects are tracked (the synthetic clip's second block, frame 25)
    crowded = [f for f in set(born.values()) if any(b < f for b in born.values())]
    assert crowded, f"the clip has no births beside tracked objects to exercise: {born}"
    f = min(crowded)
    # every object alive there has its memory of the frame made, once: the older ones binarized with the births
    alive = {o for o, b in born.items() if b <= f and o not in events["removed"]}
    assert set(per_frame[f]) == alive, (per_frame[f], born)
    reencoded = [ids for frame, ids, binarized in calls if frame == f and binarized]
    assert reencoded and any(born[o] < f for o in reencoded[0]), calls
