"""Drive Meta's predictor through its public request API and record every response (reference env).

Only ``handle_request`` / ``handle_stream_request`` produce the recorded outputs. ``snapshot`` reads (never
writes) the session's tracker states after a request, for the behaviour notes (buckets, conditioning
frames); those go to the JSON's ``internals``, apart from the responses.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

import common

# Every response of the 3.1 predictor's propagate/add_prompt/remove_object carries these.
OFFICIAL_KEYS = ("out_obj_ids", "out_probs", "out_boxes_xywh", "out_binary_masks")


class Driver:
    def __init__(self, predictor, log=print):
        self.pred = predictor
        self.model = predictor.model
        self.records: list[dict] = []       # JSON view, one per response
        self.arrays: dict[str, np.ndarray] = {}
        self.digest = hashlib.sha256()
        self.session_id: str | None = None
        self.internals: list[dict] = []
        self.frames_processed: list[dict] = []
        self.reconditioned: list[dict] = []  # per _recondition_masklets call: frame, objects it reconditioned
        self.log = log
        self._instrument()

    def _instrument(self) -> None:
        """Record, per frame the tracker processes, what Meta's yield gating then looks at (read-only:
        the wrapped method's result is returned unchanged)."""
        m = self.model
        orig = type(m)._run_single_frame_inference
        rec = self.frames_processed

        def wrapped(inference_state, frame_idx, reverse, **k):
            out = orig(m, inference_state, frame_idx, reverse, **k)
            masks = out.get("obj_id_to_mask", {})
            sam2 = out.get("obj_id_to_sam2_score", {})
            rec.append({
                "frame": int(frame_idx), "reverse": bool(reverse),
                "obj_ids": sorted(int(i) for i in masks),
                "nonempty_mask_obj_ids": sorted(int(i) for i, v in masks.items() if bool(v.any())),
                "tracker_scores": {str(int(i)): round(float(v), 5) for i, v in sorted(sam2.items())},
                "unconfirmed_obj_ids": sorted(int(i) for i in out.get("unconfirmed_obj_ids") or ()),
                "suppressed_obj_ids": sorted(int(i) for i in out.get("suppressed_obj_ids") or ()),
                "removed_obj_ids": sorted(int(i) for i in out.get("removed_obj_ids") or ()),
                "frame_stats": common.jsonable(out.get("frame_stats")),
            })
            return out

        m._run_single_frame_inference = wrapped

        orig_recond = type(m)._recondition_masklets
        calls = self.reconditioned

        def recond(frame_idx, det_out, trk_id_to_det, *a, **k):
            states, ids = orig_recond(m, frame_idx, det_out, trk_id_to_det, *a, **k)
            calls.append({"frame": int(frame_idx),
                          "candidates": {str(int(o)): int(d) for o, d in trk_id_to_det.items()},
                          "reconditioned_obj_ids": sorted(int(o) for o in ids)})
            return states, ids

        m._recondition_masklets = recond

    # -- requests ---------------------------------------------------------------------------
    def start(self, frames_dir: Path) -> str:
        out = self.pred.handle_request(dict(type="start_session", resource_path=str(frames_dir)))
        self.session_id = out["session_id"]
        return self.session_id

    @property
    def state(self) -> dict:
        return self.pred._all_inference_states[self.session_id]["state"]

    def request(self, tag: str, **r) -> dict:
        """handle_request(r) for this session; records the response's outputs."""
        r = dict(r, session_id=self.session_id)
        t = time.perf_counter()
        out = self.pred.handle_request(r)
        dt = time.perf_counter() - t
        outputs = out.get("outputs") if isinstance(out, dict) else None
        self._record(tag, r, out.get("frame_index") if isinstance(out, dict) else None, outputs, dt)
        self.snapshot(f"after {tag}")
        return out

    def stream(self, tag: str, **r) -> list[int]:
        """handle_stream_request(r) (propagate_in_video); records every yielded frame."""
        r = dict(r, session_id=self.session_id, type="propagate_in_video")
        frames = []
        t = last = time.perf_counter()
        for out in self.pred.handle_stream_request(r):
            now = time.perf_counter()
            self._record(tag, r, out["frame_index"], out["outputs"], now - last)
            frames.append(int(out["frame_index"]))
            last = now
        self.log(f"  {tag}: {len(frames)} frames in {time.perf_counter() - t:.1f} s "
                 f"(objects per frame {[self.records[-len(frames) + i]['n_obj'] for i in range(len(frames))]})")
        self.snapshot(f"after {tag}")
        return frames

    def close(self) -> None:
        self.model.__dict__.pop("_run_single_frame_inference", None)
        self.model.__dict__.pop("_recondition_masklets", None)
        if self.session_id is not None:
            self.pred.handle_request(dict(type="close_session", session_id=self.session_id))
            self.session_id = None

    # -- recording --------------------------------------------------------------------------
    def _record(self, tag, request, frame_index, outputs, seconds) -> None:
        i = len(self.records)
        req = {k: common.jsonable(v) for k, v in request.items() if k != "session_id"}
        rec = {"i": i, "tag": tag, "type": request.get("type"), "request": req,
               "frame_index": None if frame_index is None else int(frame_index),
               "seconds": round(seconds, 3)}
        if not isinstance(outputs, dict):
            # e.g. a click for a new object past max_num_objects: Meta returns (frame, None)
            rec["outputs"] = None if outputs is None else repr(outputs)[:200]
            rec["n_obj"] = 0
            self.digest.update(f"{i}:none".encode())
            self.records.append(rec)
            return
        h = self.digest
        h.update(f"{i}:{rec['type']}:{rec['frame_index']}".encode())
        extra = {}
        for k in sorted(outputs):
            v = common.to_numpy(outputs[k])
            if isinstance(v, np.ndarray):
                # copy now: batched post-processing hands out views into a buffer it reuses
                v = np.array(v, copy=True)
                common.update_digest(h, k, v)
                if k == "out_binary_masks":
                    packed, shape = common.pack_masks(v)
                    self.arrays[f"{i:04d}/out_binary_masks_packbits"] = packed
                    self.arrays[f"{i:04d}/out_binary_masks_shape"] = np.array(shape, np.int64)
                else:
                    self.arrays[f"{i:04d}/{k}"] = v
            else:
                extra[k] = common.jsonable(v)
        missing = [k for k in OFFICIAL_KEYS if k not in outputs]
        ids = np.asarray(outputs.get("out_obj_ids", []))
        masks = np.asarray(common.to_numpy(outputs.get("out_binary_masks", np.zeros((0, 0, 0), bool))))
        rec.update({
            "n_obj": int(ids.size),
            "obj_ids": [int(x) for x in ids.tolist()],
            "probs": [float(x) for x in np.asarray(common.to_numpy(outputs.get("out_probs", []))).tolist()],
            "mask_areas": [int(a) for a in masks.sum(axis=(1, 2))] if masks.ndim == 3 else [],
            "keys": sorted(outputs),
            "missing_official_keys": missing,
            "other_fields": extra,
        })
        self.records.append(rec)

    def snapshot(self, when: str) -> None:
        """Read-only view of the session's tracker states: objects, buckets, conditioning frames."""
        if self.session_id is None:
            return
        self.internals.append({"when": when, **snapshot_states(self.state)})

    def results(self) -> dict:
        return {"responses": self.records, "digest": self.digest.hexdigest(),
                "internals": self.internals, "frames_processed": self.frames_processed,
                "reconditioned": self.reconditioned}


def snapshot_states(st: dict) -> dict:
    states = []
    for s in st.get("sam2_inference_states", []):
        ms = s.get("multiplex_state")
        od = s.get("output_dict", {})

        def frames(kind):
            return {int(t): sorted(int(o) for o in (v.get("conditioning_objects") or ()))
                    for t, v in sorted(od.get(kind, {}).items())}

        states.append({
            "obj_ids": [int(x) for x in s.get("obj_ids", [])],
            "buckets": None if ms is None else [[int(e) for e in b] for b in ms.assignments],
            "cond_frames": frames("cond_frame_outputs"),
            # frame -> indices (in this state) flagged as conditioning objects in the memory encoder
            "non_cond_frames_conditioning_objects": {t: v for t, v in frames("non_cond_frame_outputs").items() if v},
            "non_cond_frames": sorted(int(t) for t in od.get("non_cond_frame_outputs", {})),
        })
    md = st.get("tracker_metadata") or {}
    r0 = md.get("rank0_metadata") or {}
    return {
        "tracker_states": states,
        "obj_ids_all": [int(x) for x in np.asarray(md.get("obj_ids_all_gpu", [])).tolist()],
        "max_obj_id": common.jsonable(md.get("max_obj_id")),
        "removed_obj_ids": sorted(int(x) for x in r0.get("removed_obj_ids", ())),
    }


def save(out_dir: Path, name: str, driver: Driver, meta: dict) -> dict:
    """<name>.npz (every response's arrays, masks bit-packed) + <name>.json (index, digest, meta)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f"{name}.npz.partial"
    with open(tmp, "wb") as f:
        np.savez_compressed(f, **driver.arrays)
    tmp.rename(out_dir / f"{name}.npz")
    doc = {"scenario": name, **meta, **driver.results()}
    common.write_json(out_dir / f"{name}.json", doc)
    return doc
