"""The load cache (sam3track/backends/compile_cache.py, hash_record.py), deferred graphs and the stderr
notice of a slow load, on the tiny bundle. Hits and misses are read from the cache's counters and files,
never from the clock."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import openvino  # noqa: F401  a test dependency: missing, this module fails rather than skips
import pytest

import sam3track
from sam3track import load_notice
from sam3track.backends.compile_cache import STATS
from sam3track.video import open_video

from .conftest import CLIPS, REPO, communicate

GRAPHS = 7  # the tiny SAM 3 bundle's graphs
DEFERRED = {"interactive_decoder", "mask_init"}


@pytest.fixture(scope="module")
def frames():
    with open_video(CLIPS / "bikes.mp4") as video:
        return np.stack([video.read(i) for i in range(76, 78)])


def _load(bundle, cache, **kw):
    """A load into `cache`, and what the cache did meanwhile."""
    before = STATS.copy()
    predictor = sam3track.load(bundle, compile_cache=cache, **kw)
    return predictor, {k: STATS[k] - before[k] for k in ("hit", "written", "unusable") if STATS[k] - before[k]}


def _entries(cache):
    return sorted(p for p in (cache / f"onnxruntime-{_ort_version()}").iterdir() if not p.name.endswith(".partial"))


def _ort_version():
    import onnxruntime

    return onnxruntime.__version__


def _masks(predictor, frames):
    with predictor.start_session(frames) as s:
        s.add_prompt(text="bike")
        return [(r.object_ids.copy(), r.masks.copy(), r.scores.copy()) for r in s.propagate()]


def _workers_stop_spinning_after_runs(predictor):
    """Every session the backend opened stops its workers' spinning when a run ends (ort_sessions.py:
    otherwise they spin into the next session's run); its copy and gather helpers have no workers."""
    backend = predictor.backend
    sessions = [g.session for g in backend._graphs if g.session is not None]
    assert sessions
    for session in sessions:
        assert session.get_session_options().get_session_config_entry("session.force_spinning_stop") == "1"
    for session in backend._copy_sessions.values():
        assert session.get_session_options().intra_op_num_threads == 1


def test_second_load_hits_the_cache_and_tracks_the_same(tiny_bundle, frames, tmp_path):
    cache = tmp_path / "cache"
    first, did = _load(tiny_bundle, cache)
    assert did == {"written": GRAPHS}
    assert len(_entries(cache)) == GRAPHS and len(list((cache / "hashes").iterdir())) == 1
    _workers_stop_spinning_after_runs(first)  # sessions optimised now
    first.close()
    second, did = _load(tiny_bundle, cache)
    assert did == {"hit": GRAPHS}
    cached = _masks(second, frames)
    _workers_stop_spinning_after_runs(second)  # sessions opened from the cache
    assert second.backend._copy_sessions
    second.close()
    with sam3track.load(tiny_bundle, compile_cache=False) as plain:
        direct = _masks(plain, frames)
        _workers_stop_spinning_after_runs(plain)
    assert len(cached) == len(direct) == len(frames) and any(len(ids) for ids, _, _ in cached)
    for a, b in zip(cached, direct):  # the same graph optimised the same way: equal to the bit
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_recorded_sha256s_still_catch_a_changed_file(tiny_bundle, tmp_path):
    import shutil

    from sam3track.bundle import Bundle

    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    Bundle.open(bundle, cache=tmp_path / "cache")
    record = json.loads(next((tmp_path / "cache" / "hashes").iterdir()).read_text())
    assert len(record["files"]) == GRAPHS + 2  # and the tokenizer's two files
    with open(bundle / "mask_init.onnx", "r+b") as f:  # same size, new content and times
        f.seek(100)
        f.write(b"\0" * 16)
    with pytest.raises(sam3track.BundleError, match="checksum mismatch for .*mask_init.onnx"):
        Bundle.open(bundle, cache=tmp_path / "cache")


def test_deferred_graphs_open_at_first_use_and_close_with_the_rest(tiny_bundle, frames, tmp_path):
    predictor, _ = _load(tiny_bundle, tmp_path / "cache")
    assert all(g.loaded for g in predictor.graphs.values())  # a cold load: every graph optimised (and saved)
    predictor.close()
    predictor, _ = _load(tiny_bundle, tmp_path / "cache")
    assert {n for n, g in predictor.graphs.items() if not g.loaded} == DEFERRED
    graphs = dict(predictor.graphs)
    with predictor.start_session(frames) as s:
        s.add_prompt(frame_index=0, points=[[40, 30]], labels=[1], obj_id=1)
    assert graphs["interactive_decoder"].loaded and not graphs["mask_init"].loaded  # clicks only
    predictor.close()
    assert not any(g.loaded for g in graphs.values())  # the never-opened one included
    with pytest.raises(sam3track.BackendError, match="closed"):
        predictor.backend.run(graphs["mask_init"], {})


def _prompts_then_frames(predictor, frames):
    """Two text prompts, then the frames; whether the text encoder was open after each prompt and after
    the first frame, what the compile cache did meanwhile, and the tracks."""
    encoder, loaded = predictor.graphs["text_encoder"], []
    before = STATS.copy()
    with predictor.start_session(frames) as s:
        for text in ("bike", "person"):
            s.add_prompt(text=text)
            loaded.append(encoder.loaded)
        results = s.propagate()
        tracks = [next(results)]
        loaded.append(encoder.loaded)
        tracks += list(results)
    did = {k: STATS[k] - before[k] for k in ("hit", "written", "unusable") if STATS[k] - before[k]}
    return loaded, did, [(r.object_ids.copy(), r.masks.copy(), r.scores.copy()) for r in tracks]


def test_a_released_text_encoder_is_freed_when_a_frame_runs_and_tracks_the_same(tiny_bundle, frames, tmp_path,
                                                                                 monkeypatch):
    """release_text_encoder (full size: 1.2 GB of weights kept out of every frame's peak): the encoder stays
    open through a burst of prompts, is freed when the next graph runs, and opens again from its cache
    entry (a hit, nothing written) at the next prompt; the tracks do not change."""
    from sam3track.backends import compile_cache

    cache = tmp_path / "cache"
    cold, _ = _load(tiny_bundle, cache, release_text_encoder=True)  # a miss: optimised, saved, then freed
    assert not cold.graphs["text_encoder"].loaded
    loaded, did, _ = _prompts_then_frames(cold, frames)
    assert loaded == [True, True, False] and did == {"hit": 1}
    cold.close()
    monkeypatch.setattr(compile_cache, "RELEASE_MIN_BYTES", 1)  # the default rule, at a size the tiny one passes
    warm, _ = _load(tiny_bundle, cache)
    assert not warm.graphs["text_encoder"].loaded  # not opened at load either
    loaded, did, released = _prompts_then_frames(warm, frames)
    # opened from the entry the load checked (its hit counted then), nothing written
    assert loaded == [True, True, False] and did == {} and warm.backend.calls["text_encoder"] == 2
    warm.close()
    monkeypatch.undo()
    kept, _ = _load(tiny_bundle, cache)  # the default: a text encoder this small (a few MB) stays
    loaded, _, resident = _prompts_then_frames(kept, frames)
    assert loaded == [True, True, True]
    kept.close()
    with sam3track.load(tiny_bundle, compile_cache=False, release_text_encoder=True) as uncached:
        assert _prompts_then_frames(uncached, frames)[0] == [True, True, True]  # nothing to reopen it from: kept
    assert any(len(ids) for ids, _, _ in released)
    for a, b in zip(released, resident, strict=True):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_a_released_text_encoder_whose_entry_went_is_made_again_and_fp16_weights_release_too(tiny_bundle, frames,
                                                                                              tmp_path):
    import shutil

    cache = tmp_path / "cache"
    predictor, _ = _load(tiny_bundle, cache, release_text_encoder=True, weights="fp16")
    _, did, _ = _prompts_then_frames(predictor, frames)
    assert did == {"hit": 1}
    entry = predictor.graphs["text_encoder"].saved[1]
    shutil.rmtree(entry)  # pruned by another process while freed
    loaded, did, _ = _prompts_then_frames(predictor, frames)
    assert loaded == [True, True, False] and "written" in did and (entry / "model.onnx").is_file()
    predictor.close()


def test_openvino_releases_its_text_encoder_too_and_tracks_the_same(tiny_bundle, frames, tmp_path):
    """On OpenVINO a released text encoder is compiled at the first prompt of a burst (from OpenVINO's
    blob cache after the first time), dropped when a frame's graph runs, compiled again at the next
    prompt; the tracks equal a load that keeps it. Without a cache there is nothing to compile it again
    from quickly: it stays. (openvino is a test dependency: without it this fails, never skips.)"""
    cache = tmp_path / "cache"
    tracks = {}
    for release in (True, False):
        with sam3track.load(tiny_bundle, backend="openvino", compile_cache=cache,
                            release_text_encoder=release) as predictor:
            encoder = predictor.graphs["text_encoder"]
            assert encoder.loaded is not release  # released: not compiled at load
            loaded, _, tracks[release] = _prompts_then_frames(predictor, frames)
            assert loaded == ([True, True, False] if release else [True, True, True])
            loaded, _, again = _prompts_then_frames(predictor, frames)  # compiled again, the same tracks
            assert loaded == ([True, True, False] if release else [True, True, True])
            for a, b in zip(again, tracks[release], strict=True):
                for x, y in zip(a, b):
                    np.testing.assert_array_equal(x, y)
            assert predictor.backend.calls["text_encoder"] == 4
    assert any(len(ids) for ids, _, _ in tracks[True])
    for a, b in zip(tracks[True], tracks[False], strict=True):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    with sam3track.load(tiny_bundle, backend="openvino", compile_cache=False, release_text_encoder=True) as uncached:
        assert _prompts_then_frames(uncached, frames)[0] == [True, True, True]


def test_concurrent_loads_into_one_empty_cache(tiny_bundle, tmp_path):
    cache = tmp_path / "cache"
    code = ("import json, sam3track; from sam3track.backends.compile_cache import STATS; "
            f"sam3track.load({str(tiny_bundle)!r}, compile_cache={str(cache)!r}).close(); print(json.dumps(STATS))")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    outs = [communicate(p, "a concurrent load") for p in procs]
    for proc, (out, err) in zip(procs, outs):
        assert proc.returncode == 0, err
        assert "unusable" not in json.loads(out.splitlines()[-1]), err
    assert len(_entries(cache)) == GRAPHS
    assert not list((cache / f"onnxruntime-{_ort_version()}").glob("*.partial"))
    predictor, did = _load(tiny_bundle, cache)
    predictor.close()
    assert did == {"hit": GRAPHS}


def test_damaged_entries_are_misses_and_written_again(tiny_bundle, tmp_path):
    cache = tmp_path / "cache"
    sam3track.load(tiny_bundle, compile_cache=cache).close()
    entries = {e.name.split("-")[0]: e / "model.onnx" for e in _entries(cache)}
    truncated, garbled = entries["backbone"], entries["grounding_head"]
    truncated.write_bytes(truncated.read_bytes()[:100])  # its size no longer the recorded one
    stat = garbled.stat()  # garbage with the size and times the entry recorded: only opening it finds out
    garbled.write_bytes(b"\xff" * stat.st_size)
    os.utime(garbled, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    predictor, did = _load(tiny_bundle, cache)
    # the truncated one a miss; the garbled one found, failing to open, dropped: both optimised and written again
    assert did == {"unusable": 2, "written": 2, "hit": GRAPHS - 1}
    assert predictor.graphs["grounding_head"].loaded
    predictor.close()
    predictor, did = _load(tiny_bundle, cache)
    predictor.close()
    assert did == {"hit": GRAPHS}


def test_opt_out_writes_nothing(tiny_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("SAM3TRACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SAM3TRACK_COMPILE_CACHE", "0")
    predictor, did = _load(tiny_bundle, None)
    assert did == {} and not (tmp_path / "cache").exists()
    assert all(g.loaded for g in predictor.graphs.values())  # nothing to describe a deferred graph: all loaded
    predictor.close()


def test_an_unwritable_cache_folder_still_loads(tiny_bundle, tmp_path, capfd):
    # a file where the folder would be: every write fails, as in a read-only home (root ignores modes)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    predictor, did = _load(tiny_bundle, blocked / "cache")
    predictor.close()
    assert did == {}
    assert "cannot write the compile cache" in capfd.readouterr().err


def test_a_slow_load_says_what_it_does(tiny_bundle, tmp_path, capfd, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setattr(load_notice, "NOTICE_AFTER", 0.0)  # every step counts as slow
    sam3track.load(tiny_bundle, compile_cache=cache).close()
    err = capfd.readouterr().err
    assert "sam3track: checking the sha256 of" in err
    assert "sam3track: optimising graph backbone for ONNX Runtime into the cache" in err
    monkeypatch.setattr(load_notice, "NOTICE_AFTER", 60.0)  # far above a tiny load, however loaded the machine
    sam3track.load(tiny_bundle, compile_cache=cache).close()
    assert "sam3track:" not in capfd.readouterr().err


def test_bad_setting_names_what_is_accepted(tiny_bundle):
    with pytest.raises(sam3track.Sam3TrackError, match="compile_cache must be True, False, None or a folder"):
        sam3track.load(tiny_bundle, compile_cache=3)


def test_openvino_compiles_deferred_graphs_at_first_use_into_its_cache(tiny_bundle, tmp_path):
    cache = tmp_path / "cache"
    with sam3track.load(tiny_bundle, backend="openvino", compile_cache=cache) as predictor:
        assert {n for n, g in predictor.graphs.items() if g.compiled is None} == DEFERRED
        folders = list(cache.glob("openvino-*/*"))
        assert len(folders) == 1 and any(folders[0].iterdir())  # OpenVINO's blobs, in the bundle's folder


def test_openvino_precisions_and_thread_counts_never_share_compiled_blobs(tiny_bundle, tmp_path):
    """OpenVINO 2026.4 names one blob for a graph at f32, bf16, one thread and every thread: in one cache
    folder a bf16 load imported the fp32 compile and corrupted the heap at its first run (the suite's
    crash in the benchmark smoke test). Each config (and weights="fp16") gets its own folder, from load()
    and from an explicit cache_dir= alike."""
    from sam3track.backends import create_backend
    from sam3track.backends.openvino import cpu_capabilities

    precisions = ("fp32", "bf16") if "BF16" in cpu_capabilities() else ("fp32",)
    configs = [(p, t, "fp32") for p in precisions for t in (None, 1)] + [("fp32", None, "fp16")]
    cache = tmp_path / "cache"
    for precision, threads, weights in configs:
        with sam3track.load(tiny_bundle, backend="openvino", compile_cache=cache, precision=precision,
                            threads=threads, weights=weights) as predictor:
            folder = Path(predictor.backend._config["CACHE_DIR"])
            assert folder.parent.name.startswith("openvino-") and any(folder.iterdir())  # blobs written
    assert len(list(cache.glob("openvino-*/*"))) == len(configs)
    explicit = tmp_path / "explicit"
    for precision, threads, weights in configs:
        create_backend("openvino", "cpu", precision=precision, threads=threads, cache_dir=explicit,
                       weights=weights).close()
    names = [f"{p}{'' if w == 'fp32' else '-' + w}-threads-{t or 'all'}" for p, t, w in configs]
    assert sorted(p.name for p in explicit.iterdir()) == sorted(names)


def _fake_entry(folder: Path, size: int, age_seconds: float) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.data").write_bytes(b"\0" * size)
    used = time.time() - age_seconds
    os.utime(folder, (used, used))
    return folder


def test_the_cache_stays_within_its_cap_dropping_entries_used_least_recently(tiny_bundle, tmp_path, capfd,
                                                                             monkeypatch):
    """Past $SAM3TRACK_CACHE_MAX_GB a load removes whole entries, least recently used first: never its
    own, never one used in the last hour (another process may be opening it), and says so on stderr."""
    cache = tmp_path / "cache"
    _load(tiny_bundle, cache)[0].close()
    mine = set(_entries(cache))
    old_ort = _fake_entry(cache / "onnxruntime-0.0.0" / f"backbone-{'a' * 32}", 300_000, 3 * 86400)
    older_ov = _fake_entry(cache / "openvino-0.0" / ("b" * 32), 300_000, 5 * 86400)
    recent = _fake_entry(cache / "onnxruntime-0.0.0" / f"backbone-{'c' * 32}", 300_000, 60)
    capfd.readouterr()
    monkeypatch.setenv("SAM3TRACK_CACHE_MAX_GB", "0.000001")  # 1 kB: everything that may go, goes
    before = STATS["evicted"]
    predictor, did = _load(tiny_bundle, cache)
    predictor.close()
    assert did == {"hit": len(mine)} and STATS["evicted"] - before == 2
    assert not old_ort.exists() and not older_ov.exists() and recent.exists()
    assert set(_entries(cache)) == mine  # this load's entries stay (stamped used as it opens them)
    assert "removed 2 entries used least recently" in capfd.readouterr().err
    monkeypatch.setenv("SAM3TRACK_CACHE_MAX_GB", "0")  # no cap
    _fake_entry(old_ort, 300_000, 3 * 86400)
    _load(tiny_bundle, cache)[0].close()
    assert old_ort.exists() and STATS["evicted"] - before == 2


def test_pruning_goes_oldest_first_and_stops_at_the_cap(tmp_path, monkeypatch):
    from sam3track.backends.compile_cache import CompileCache, prune

    key = "0123456789abcdef" * 2  # entry folders are named <graph>-<32 hex> (ONNX Runtime) or <32 hex>
    a = _fake_entry(tmp_path / "onnxruntime-1.0" / f"backbone-{key}", 1000, 4 * 3600)
    b = _fake_entry(tmp_path / "onnxruntime-1.0" / f"text_encoder-{key}", 1000, 3 * 3600)
    c = _fake_entry(tmp_path / "openvino-1.0" / key, 1000, 2 * 3600)
    stray = _fake_entry(tmp_path / "onnxruntime-linux-x64-1.20.1" / "lib", 1000, 9 * 3600)  # not ours
    other = _fake_entry(tmp_path / "openvino-1.0" / "notes", 1000, 9 * 3600)  # not an entry's name
    killed = _fake_entry(tmp_path / "openvino-1.0" / f"{key}.123.abcd.partial", 1000, 5 * 3600)
    (tmp_path / "hashes").mkdir()  # sha256 records: not entries
    assert prune(tmp_path, 1500, keep={a}) == [b, c]  # a is kept (in use); b, then c, down to 1000
    assert stray.exists() and other.exists() and not killed.exists()  # a killed load's folder went too
    assert prune(tmp_path, 1500) == [] and a.exists()  # within the cap
    assert prune(tmp_path, None) == [] and a.exists()
    live = CompileCache(tmp_path, {})  # a predictor alive in this process: its entries stay
    live.used.add(a)
    monkeypatch.setenv("SAM3TRACK_CACHE_MAX_GB", "0.0000001")
    assert CompileCache(tmp_path, {}).prune() == [] and a.exists()
    del live
    gc.collect()
    assert CompileCache(tmp_path, {}).prune() == [a]
    for text in ("inf", "nan", "lots"):  # never an error: no cap, or the default with a line on stderr
        monkeypatch.setenv("SAM3TRACK_CACHE_MAX_GB", text)
        assert CompileCache(tmp_path, {}).prune() == []


def test_fp16_weights_track_within_the_parity_tolerances_and_come_from_the_cache(tiny_bundle, tmp_path):
    """weights="fp16" (ONNX Runtime on the CPU): every graph's large weights stored in fp16 behind Cast
    nodes in a cache entry of its own, made from the fp32 one; tracking within the fidelity gate's
    tolerances of fp32 (the gate's own clip: three clicked objects); a second load opens it as a hit."""
    import onnx

    from sam3track.backend_choice import compare, gate_clip, track_gate_clip

    cache = tmp_path / "cache"
    base, _ = _load(tiny_bundle, cache, backend="onnxruntime")
    clip, clicks = gate_clip(base.bundle.manifest)
    fp32, _, _ = track_gate_clip(base, clip, clicks)
    half, did = _load(tiny_bundle, cache, weights="fp16")  # "auto" with weights= means ONNX Runtime
    assert half.backend_choice.backend == "onnxruntime" and half.backend_choice.options == {"weights": "fp16"}
    assert did == {"hit": GRAPHS, "written": GRAPHS}  # the fp32 entries read, the fp16 ones written
    fp16, _, _ = track_gate_clip(half, clip, clicks)
    same_ids, iou_mean, iou_min = compare(fp32, fp16)
    assert same_ids and iou_mean >= 0.99 and iou_min >= 0.95, (iou_mean, iou_min)
    assert sum(len(ids) for ids, _ in fp16) >= len(clicks)  # objects were tracked
    saved = [e for e in _entries(cache) if e.name.startswith("backbone-")]
    kinds = []
    for entry in saved:
        model = onnx.load(str(entry / "model.onnx"), load_external_data=False)
        kinds.append(sum(1 for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16))
    assert sorted(kinds)[0] == 0 and sorted(kinds)[1] > 0  # the fp32 entry and the fp16 one
    again, did = _load(tiny_bundle, cache, weights="fp16")
    again.close()
    assert did == {"hit": GRAPHS}


def test_fp16_weights_without_a_cache_leave_nothing_behind(tiny_bundle, frames, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    predictor = sam3track.load(tiny_bundle, weights="fp16", compile_cache=False)
    # the scratch folders are gone once each session has mapped its files: nothing is left to leak
    # if the process is killed, and the sessions run on
    assert not any(tmp_path.iterdir())
    assert len(_masks(predictor, frames)) == len(frames)
    predictor.close()


@pytest.mark.parametrize("kw, words", [({"weights": "bf16"}, "use one of 'fp32', 'fp16'"),
                                       ({"weights": "bf16", "backend": "openvino"}, "use one of 'fp32', 'fp16'")])
def test_bad_weights_settings_name_what_is_accepted(tiny_bundle, kw, words):
    with pytest.raises(sam3track.Sam3TrackError, match=words):
        sam3track.load(tiny_bundle, compile_cache=False, **kw)
    from sam3track.backends import create_backend

    with pytest.raises(sam3track.Sam3TrackError, match="onnxruntime and openvino option"):
        create_backend("acl", "npu:0", weights="fp16")


def test_cli_track_passes_weights(monkeypatch):
    from sam3track.cli import build_parser
    from sam3track.commands.track import cmd_track

    calls = []
    monkeypatch.setattr("sam3track.jobs.track.run_track", lambda job, **kwargs: calls.append(job) or 0)
    assert cmd_track(build_parser().parse_args(["track", "v.mp4", "-p", "person", "--weights", "fp16"])) == 0
    assert calls[0].load_options == {"weights": "fp16"}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["track", "v.mp4", "-p", "x", "--weights", "bf16"])
