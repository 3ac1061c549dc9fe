"""Check a SAM 3.1 bundle's graphs in ONNX Runtime against Meta's recorded outputs and our torch wrappers.

    python -m graphs.check BUNDLE          # dispatched here by the manifest's family

Checks are registered per graph (``CHECKS``, ``register``); the tracker graphs' come from
tracker_check.py.
The two references and the rules for bf16-rounded outputs (``_conv_of_rounded_ok``,
``Sam31Checker.compare_rounded``): docs/sam31.md, "Checks and the reference".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from ..comparison import (BF16_CRITERION, FP16_TOL, FP32_TOL, HEADER, INT8_TOL, CheckError, Row,
                          relative_error, within_one_bf16_step)

CHECKS: dict[str, Callable[["Sam31Checker"], None]] = {}
CONV_CRITERION = "1 bf16 step in"  # conv_s0 / conv_s1 of rounded levels: one step of their input


def register(graph: str):
    """Decorator: ``fn(checker)`` checks graph ``graph`` and appends rows to ``checker.rows``."""
    def wrap(fn):
        CHECKS[graph] = fn
        return fn
    return wrap


def _possible_flips(unrounded: np.ndarray) -> np.ndarray:
    """The bfloat16 step of each element that may round to the other side within fp32 noise, else 0."""
    u = unrounded.astype(np.float64)
    step = np.exp2(np.floor(np.log2(np.maximum(np.abs(u), 1e-30))) - 7)
    nearest = np.round(u / step) * step
    to_boundary = step / 2 - np.abs(u - nearest)
    noise = FP32_TOL * float(np.abs(u).max(initial=0.0))
    return np.where(to_boundary <= noise, step, 0.0)


def _conv_of_rounded_ok(got, ref, weight, unrounded) -> bool:
    """|got - ref| <= |W| * (possible one-step flips of the conv's input) + the fp32 bound, for a 1x1 conv
    with weight [Cout, Cin, 1, 1] applied to levels [N, Cin, H, W] rounded to bfloat16."""
    allowed = np.einsum("oi,nihw->nohw", np.abs(weight[:, :, 0, 0]).astype(np.float64), _possible_flips(unrounded))
    noise = FP32_TOL * float(np.abs(ref).max(initial=0.0))
    return bool(np.all(np.abs(got.astype(np.float64) - ref) <= allowed * 1.0001 + noise))


class MetaReference:
    """Meta's recorded inputs and outputs for the harness's seeded checkpoint (None when unavailable)."""

    def __init__(self, modules: Path, frames: Path):
        self.modules, self.frames = Path(modules), Path(frames)
        self._cache = {}

    def dump(self, case: str):
        if case not in self._cache:
            self._cache[case] = dict(np.load(self.modules / f"{case}.npz"))
        return self._cache[case]

    def frame_calls(self) -> tuple[list[dict], dict]:
        index = json.loads((self.frames / "index.json").read_text())
        return index["calls"], self.dump_frames()

    def dump_frames(self):
        if "_frames" not in self._cache:
            self._cache["_frames"] = dict(np.load(self.frames / "features.npz"))
        return self._cache["_frames"]


class Sam31Checker:
    def __init__(self, bundle: Path, checkpoint: Path | None = None, log=print):
        import onnxruntime as ort

        self.bundle = Path(bundle)
        self.manifest = json.loads((self.bundle / "manifest.json").read_text())
        self.ort = ort
        self.sessions = {}
        self.rows: list[Row] = []
        self.notes: list[str] = []
        self.log = log
        self.checkpoint = Path(checkpoint) if checkpoint else self._recorded_checkpoint()
        self._model = None
        self._tracker = None
        self._meta = False  # not looked up yet

    def _recorded_checkpoint(self) -> Path:
        from .checkpoint import CHECKPOINT_FILES

        source = self.manifest.get("source", {})
        recorded = Path(source.get("checkpoint") or "")
        if recorded.is_file():
            return recorded
        if source.get("tiny"):  # the harness's cache moved or was cleared: make it again
            from .export import tiny_checkpoint

            return tiny_checkpoint()
        raise CheckError(f"{self.bundle} was exported from {recorded}, which is gone; pass --checkpoint "
                         f"(Meta's {CHECKPOINT_FILES[0]})")

    # ------------------------------------------------------------------------------- references
    @property
    def model(self):
        if self._model is None:
            import torch

            from .checkpoint import load_detector

            torch.set_grad_enabled(False)
            self._model, _ = load_detector(self.checkpoint)
        return self._model

    @property
    def tracker(self):
        """The torch tracker of this bundle's checkpoint (graphs/sam31/tracker.py)."""
        if self._tracker is None:
            from . import checkpoint as ckpt
            from .tracker import Sam31Tracker

            state = ckpt.public_keys(ckpt._load_raw(ckpt.find_checkpoint_file(self.checkpoint)))
            grid = self.manifest["config"]["geometry"]["image_size"] // ckpt.PATCH
            self._tracker = Sam31Tracker.from_state_dict(state, grid)
        return self._tracker

    @property
    def meta(self) -> MetaReference | None:
        """Meta's dumps when this bundle's checkpoint is the harness's seeded one."""
        if self._meta is False:
            self._meta = self._find_meta()
        return self._meta

    def _find_meta(self):
        from sam3track.bundle import file_sha256

        from . import reference as ref
        from . import meta_runs

        env = ref.find_env()
        if env is None:
            self.notes.append(f"Meta reference: skipped, {ref.missing_reason()}")
            return None
        ckdir = ref.checkpoint_dir(env)
        seeded = json.loads((ckdir / "checkpoint_info.json").read_text())["sha256"]
        if file_sha256(self.checkpoint) != seeded:
            self.notes.append("Meta reference: skipped, the harness records Meta's outputs for its seeded checkpoint "
                              "only; this bundle has other weights (torch checks only)")
            return None
        return MetaReference(ref.module_dumps(env, ckdir), meta_runs.frame_features(env, ckdir / "sam3.1_multiplex.pt"))

    def wrapper(self, name: str):
        from . import detector

        dims = detector.Dims.from_sizes(self.model.sizes)
        return detector.graph_specs(dims)[name].module(self.model).eval()

    # ------------------------------------------------------------------------------- running
    def session(self, name):
        if name not in self.sessions:
            path = self.bundle / self.manifest["graphs"][name]["file"]
            self.sessions[name] = self.ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return self.sessions[name]

    def run(self, name, feeds) -> dict[str, np.ndarray]:
        """The graph's outputs by name; feeds converted to the dtypes the manifest lists."""
        spec = self.manifest["graphs"][name]
        dtypes = {t["name"]: np.dtype(t["dtype"]) for t in spec["inputs"]}
        out = self.session(name).run(None, {k: np.ascontiguousarray(np.asarray(v), dtype=dtypes[k])
                                            for k, v in feeds.items()})
        return dict(zip([t["name"] for t in spec["outputs"]], out))

    def torch_run(self, name, feeds) -> dict[str, np.ndarray]:
        import torch

        spec = self.manifest["graphs"][name]
        types = {"float32": torch.float32, "int32": torch.int32}
        args = [torch.as_tensor(np.asarray(feeds[t["name"]])).to(types[t["dtype"]]) for t in spec["inputs"]]
        out = self.wrapper(name)(*args)
        out = out if isinstance(out, tuple) else (out,)
        return {t["name"]: o.numpy() for t, o in zip(spec["outputs"], out)}

    # ------------------------------------------------------------------------------- comparing
    def tolerance(self, graph) -> float:
        return {"fp16": FP16_TOL, "int8": INT8_TOL}.get(self.manifest["graphs"][graph]["precision"], FP32_TOL)

    def compare(self, graph, case, name, got, ref, bf16=False):
        ref = np.asarray(ref, dtype=np.float32)
        got = np.asarray(got, dtype=np.float32)
        if got.shape != ref.shape:
            self.rows.append(Row(graph, case, name, float("inf"), float("inf"), 0.0, f"FAIL shape {got.shape} != {ref.shape}"))
            return
        max_abs, rel = relative_error(got, ref)
        if bf16 and self.manifest["graphs"][graph]["precision"] == "fp32":
            ok = within_one_bf16_step(got, ref)
            self.rows.append(Row(graph, case, name, max_abs, rel, None, "" if ok else "beyond one bf16 step",
                                 criterion=BF16_CRITERION, criterion_met=ok))
        else:
            self.rows.append(Row(graph, case, name, max_abs, rel, self.tolerance(graph)))

    def compare_rounded(self, graph, case, name, got, ref, plain_ref, weight=None, unrounded=None, ref_input=None):
        """A tracker level of images whose levels are rounded to bfloat16: level 2 itself, or (``weight``)
        conv_s0 / conv_s1 of rounded levels 0 / 1 (``unrounded``: our levels before rounding).

        The project's rules (one bf16 step, or the fp32 bound) hold for unrounded values too, so two
        more conditions make sure the rounding happens as Meta's: the output is closer (L2) to ``ref``,
        the rounded path's, than to ``plain_ref``, the float32 path's on the same image, and a level-2
        output is exactly representable in bfloat16. ``ref_input``: Meta's rounded conv input, which must
        be within one bf16 step of our rounding."""
        from ..bf16_rounding import SPLITTER

        got, ref, plain_ref = (np.asarray(x, np.float32) for x in (got, ref, plain_ref))
        max_abs, rel = relative_error(got, ref)
        if self.manifest["graphs"][graph]["precision"] != "fp32":
            self.rows.append(Row(graph, case, name, max_abs, rel, self.tolerance(graph)))
            return
        if weight is None:
            ok, criterion = within_one_bf16_step(got, ref), BF16_CRITERION
            problems = [] if ok else ["beyond one bf16 step"]
            scaled = got * np.float32(SPLITTER)
            if not np.array_equal(scaled - (scaled - got), got):
                problems.append("not bfloat16 values")
        else:
            ok, criterion = _conv_of_rounded_ok(got, ref, weight, unrounded), CONV_CRITERION
            problems = [] if ok else ["beyond one bf16 step of its input"]
            if ref_input is not None:
                scaled = unrounded * np.float32(SPLITTER)
                if not within_one_bf16_step(scaled - (scaled - unrounded), ref_input):
                    problems.append("conv input beyond one bf16 step of Meta's")
        to_rounded = float(np.linalg.norm((got - ref).astype(np.float64)))
        to_plain = float(np.linalg.norm((got - plain_ref).astype(np.float64)))
        if not to_rounded < to_plain:
            problems.append("closer to the float32 path")
        ratio = to_plain / to_rounded if to_rounded > 0 else float("inf")
        note = f"L2 float32 path / rounded path {ratio:.1f}" + (" FAIL: " + ", ".join(problems) if problems else "")
        self.rows.append(Row(graph, case, name, max_abs, rel, None, note, criterion=criterion,
                             criterion_met=not problems))

    def compare_outputs(self, graph, case, got: dict, ref: dict, rounded_rows=None, plain_ref=None,
                        unrounded_levels=None, ref_inputs=None):
        """Every output in ``ref``; for backbone / interactive_neck images flagged in ``rounded_rows`` the
        tracker levels get compare_rounded (``plain_ref``: the reference's float32-path outputs of those
        images; ``unrounded_levels``: our [level0, level1] of those images before rounding;
        ``ref_inputs``: Meta's rounded conv inputs, if known)."""
        rounded_rows = np.zeros(0, bool) if rounded_rows is None else np.asarray(rounded_rows, bool)
        for name, r in ref.items():
            g, r = got[name], np.asarray(ref[name])
            level = _tracker_level(name)
            if level is None or not rounded_rows.any():
                self.compare(graph, case, name, g, r)
                continue
            plain = ~rounded_rows
            if plain.any():
                self.compare(graph, f"{case} float32 rows", name, g[plain], r[plain])
            conv = None if level == 2 else self.conv(graph, level)
            self.compare_rounded(graph, f"{case} rounded rows", name, g[rounded_rows], r[rounded_rows],
                                 plain_ref[name], None if conv is None else conv.weight.numpy(),
                                 None if conv is None else unrounded_levels[level],
                                 None if conv is None or ref_inputs is None else ref_inputs[level])

    def conv(self, graph, level):
        m = self.model
        if graph == "interactive_neck":
            return m.interactive_conv_s0 if level == 0 else m.interactive_conv_s1
        return m.propagation_conv_s0 if level == 0 else m.propagation_conv_s1

    def unrounded_levels(self, graph, trunk: np.ndarray) -> list[np.ndarray]:
        """Our torch neck's levels 0 and 1 (before rounding and conv) for trunk features [I, Cv, F, F]."""
        import torch

        neck = self.model.interactive_neck if graph == "interactive_neck" else self.model.propagation_neck
        t = torch.from_numpy(np.ascontiguousarray(trunk, np.float32))
        return [neck.fpn_layers[level](t).numpy() for level in (0, 1)]


def _tracker_level(name: str) -> int | None:
    for prefix in ("tracker_feat", "interactive_feat"):
        if name == prefix:
            return 2
        if name == f"{prefix}_s0":
            return 0
        if name == f"{prefix}_s1":
            return 1
    return None


# ----------------------------------------------------------------------------------- batching
def _rows(feeds: dict, i: int, broadcast: tuple[str, ...] = ()) -> dict:
    """Row i of every input (inputs named in ``broadcast`` have one row shared by all)."""
    return {k: (v if k in broadcast else v[i:i + 1]) for k, v in feeds.items()}


def check_batching(c: Sam31Checker, graph: str, sizes: dict, case: str, broadcast=()) -> None:
    """The graph and the torch wrapper batched, each against the wrapper one row at a time."""
    from . import detector

    dims = detector.Dims.from_sizes(c.model.sizes)
    spec = detector.graph_specs(dims)[graph]
    feeds = {k: v.numpy() for k, v in detector.sample_inputs(spec, dims, sizes, seed=len(c.rows)).items()}
    n = next(v.shape[0] for k, v in feeds.items() if k not in broadcast)
    singles = [c.torch_run(graph, _rows(feeds, i, broadcast)) for i in range(n)]
    ref = {k: np.concatenate([s[k] for s in singles]) for k in singles[0]}
    rounded = feeds.get("round_levels", np.zeros(n)) > 0.5
    unrounded = plain = None
    if rounded.any():
        trunk = feeds["trunk_features"] if graph == "interactive_neck" else ref["trunk_features"]
        unrounded = [lv[rounded] for lv in c.unrounded_levels(graph, trunk)]
        plain_rows = [c.torch_run(graph, dict(_rows(feeds, i), round_levels=np.zeros(1, np.float32)))
                      for i in np.flatnonzero(rounded)]
        plain = {k: np.concatenate([s[k] for s in plain_rows]) for k in plain_rows[0]}
    for label, got in (("torch", c.torch_run(graph, feeds)), ("graph", c.run(graph, feeds))):
        c.compare_outputs(graph, f"{case} {label} vs 1-by-1", got, ref, rounded, plain, unrounded)


# ----------------------------------------------------------------------------------- the graphs
@register("text_encoder")
def check_text_encoder(c: Sam31Checker) -> None:
    if c.meta is not None:
        for b in (1, 2, 3):
            z = c.meta.dump(f"text_encoder_B{b}")
            got = c.run("text_encoder", {"input_ids": z["in/tokens"]})
            ref = {"text_features": z["out.1"].transpose(1, 0, 2), "text_mask": (~z["out.0"]).astype(np.int32)}
            c.compare_outputs("text_encoder", f"Meta B={b}", got, ref)
    check_batching(c, "text_encoder", {"prompts": 5}, "M=5")


def _meta_frames(c: Sam31Checker):
    """Meta's stored frames [calls, 3, S, S] (float32), which of them were rounded (add_prompt's
    single-frame path), Meta's features per call, and its rounded conv inputs."""
    calls, z = c.meta.frame_calls()
    images = np.stack([z[f"{k['call']}/image"].astype(np.float32) for k in calls])
    rounded = np.array([not k["batched_grounding"] for k in calls])
    if not rounded.any() or rounded.all():
        raise CheckError("the frame-feature dump holds calls of one grounding path only; both are needed")
    return calls, z, images, rounded


def _frame_refs(z, calls, prefix, graph_prefix):
    ref = {}
    for level, suffix in ((0, "_s0"), (1, "_s1"), (2, "")):
        ref[f"{graph_prefix}{suffix}"] = np.concatenate([z[f"{k['call']}/{prefix}_{level}"] for k in calls])
    conv_in = [np.concatenate([z[f"{k['call']}/{prefix}_conv_in_{level}"] for k in calls]) for level in (0, 1)]
    return ref, conv_in


def _same_frame_batched(calls, call):
    """The batched-path (float32) call on the frame of ``call``."""
    for k in calls:
        if k["frame_index"] == call["frame_index"] and k["batched_grounding"]:
            return k
    raise CheckError(f"the frame-feature dump has no float32-path call for frame {call['frame_index']}")


def _check_frames(c: Sam31Checker, graph: str) -> None:
    """The tracker levels of Meta's own frames, on both grounding paths, at I = 1 (the rounded add_prompt
    call) and I = all calls (rounded and float32 rows in one batch)."""
    calls, z, images, rounded = _meta_frames(c)
    meta_name, prefix = ("interactive", "interactive_feat") if graph == "interactive_neck" else \
        ("propagation", "tracker_feat")
    first = int(np.flatnonzero(rounded)[0])
    for rows in ([first], list(range(len(calls)))):
        sel = [calls[i] for i in rows]
        flags = rounded[rows].astype(np.float32)
        backbone = c.run("backbone", {"pixel_values": images[rows], "round_levels": flags})
        if graph == "interactive_neck":
            got = c.run("interactive_neck", {"trunk_features": backbone["trunk_features"], "round_levels": flags})
        else:
            got = backbone
        ref, conv_in = _frame_refs(z, sel, meta_name, prefix)
        mask = rounded[rows]
        # Meta's float32 path on the same frames: the propagation pass handles the prompt frame again
        plain_calls = [_same_frame_batched(calls, k) for k, m in zip(sel, mask) if m]
        plain, _ = _frame_refs(z, plain_calls, meta_name, prefix)
        unrounded = [lv[mask] for lv in c.unrounded_levels(graph, backbone["trunk_features"])]
        c.compare_outputs(graph, f"Meta frames I={len(rows)}", got, ref, mask, plain, unrounded,
                          [x[mask] for x in conv_in])


@register("backbone")
def check_backbone(c: Sam31Checker) -> None:
    if c.meta is not None:
        for t in (1, 2):
            vit, grounding = c.meta.dump(f"vit_trunk_T{t}"), c.meta.dump(f"grounding_T{t}")
            if not np.array_equal(vit["in/images"], grounding["in/images"]):
                raise CheckError("Meta's ViT and grounding dumps were made on different images")
            got = c.run("backbone", {"pixel_values": vit["in/images"], "round_levels": np.zeros(t, np.float32)})
            ref = {"trunk_features": vit["out.0"]}
            ref.update({f"detector_fpn{i}": grounding[f"sub/segmentation_head/in/kwargs.backbone_feats.{i}.tensors"]
                        for i in range(3)})
            if t == 1:  # the propagation neck's level 2 on the same trunk features (dumped at T=1)
                ref["tracker_feat"] = c.meta.dump("neck_propagation_convs_2_T1")["out"]
            c.compare_outputs("backbone", f"Meta T={t}", got, ref)
        _check_trunk_of_2x2_windows(c)
        _check_frames(c, "backbone")
    check_batching(c, "backbone", {"images": 3}, "I=3")


def _check_trunk_of_2x2_windows(c: Sam31Checker) -> None:
    """transformers' ViT (what the backbone graph exports) against Meta's on the same weights at 448 px:
    grid 32 padded to 48, 2x2 windows. The small config's image is one window (the full model's is 3x3),
    so window partitioning is held against Meta here, in torch; its export is the same op as SAM 3's."""
    import copy

    import torch
    from transformers.models.sam3.modeling_sam3 import Sam3ViTModel

    z = c.meta.dump("vit_trunk_windows2x2")
    trunk = c.model.detector.vision_encoder.backbone
    images = torch.from_numpy(z["in/images"])
    config = copy.deepcopy(trunk.config)  # the exported attention implementation included
    config.image_size = side = images.shape[-1]
    wide = Sam3ViTModel(config).eval()
    wide.load_state_dict(trunk.state_dict(), strict=True)
    with torch.no_grad():
        hidden = wide(images).last_hidden_state
    grid = side // c.model.sizes.patch_size
    got = hidden.view(len(images), grid, grid, -1).permute(0, 3, 1, 2).numpy()
    max_abs, rel = relative_error(got, z["out.0"])  # torch in float32 whatever the bundle's precision
    c.rows.append(Row("backbone", f"Meta 2x2 windows ({side} px, torch)", "trunk_features", max_abs, rel, FP32_TOL))


@register("interactive_neck")
def check_interactive_neck(c: Sam31Checker) -> None:
    if c.meta is not None:
        z = c.meta.dump("neck_interactive_convs_2_T1")
        got = c.run("interactive_neck", {"trunk_features": z["in/trunk_features"], "round_levels": np.zeros(1, np.float32)})
        c.compare_outputs("interactive_neck", "Meta T=1", got, {"interactive_feat": z["out"]})
        _check_frames(c, "interactive_neck")
    check_batching(c, "interactive_neck", {"images": 3}, "I=3")


@register("grounding_head")
def check_grounding_head(c: Sam31Checker) -> None:
    if c.meta is not None:
        for t in (1, 2):
            z = c.meta.dump(f"grounding_T{t}")
            prompt = z["sub/transformer.encoder/in/kwargs.prompt"]  # [33, T, D]: 32 text tokens + the CLS token
            pad = z["sub/transformer.encoder/in/kwargs.prompt_key_padding_mask"]  # [T, 33], True = padding
            feeds = {f"detector_fpn{i}": z[f"sub/segmentation_head/in/kwargs.backbone_feats.{i}.tensors"] for i in range(3)}
            ref = {"pred_logits": z["out.pred_logits"][..., 0], "presence_logits": z["out.presence_logit_dec"],
                   "pred_boxes": z["out.pred_boxes_xyxy"], "pred_masks": z["out.pred_masks"]}
            for prompts in sorted({t, 1}, reverse=True):  # every row its prompt, and one prompt for all
                feeds.update(text_features=prompt[:32].transpose(1, 0, 2)[:prompts],
                             text_mask=(~pad[:prompts, :32]).astype(np.int32))
                c.compare_outputs("grounding_head", f"Meta T={t} P={prompts}", c.run("grounding_head", feeds), ref)
    check_batching(c, "grounding_head", {"images": 3, "prompts": 3}, "I=3 P=3")
    check_batching(c, "grounding_head", {"images": 3, "prompts": 1}, "I=3 P=1",
                   broadcast=("text_features", "text_mask"))


@register("box_grounding_head")
def check_box_grounding_head(c: Sam31Checker) -> None:
    """Meta's forward_grounding with box prompts (dump_modules.py box_grounding: 1 image x 2 boxes, and 2
    images x 3 boxes with one padded), then batching, and padding: boxes padded to a gear (box_valid 0)
    must give what the real boxes alone give."""
    graph = "box_grounding_head"
    if c.meta is not None:
        for case in ("box_grounding_T1_K2", "box_grounding_T2_K3"):
            z = c.meta.dump(case)
            prompt = z["sub/transformer.encoder/in/kwargs.prompt"]  # [32 + K + 1, T, D]
            pad = z["sub/transformer.encoder/in/kwargs.prompt_key_padding_mask"]  # [T, 32 + K + 1], True = padding
            feeds = {f"detector_fpn{i}": z[f"sub/segmentation_head/in/kwargs.backbone_feats.{i}.tensors"] for i in range(3)}
            feeds.update(text_features=prompt[:32].transpose(1, 0, 2), text_mask=(~pad[:, :32]).astype(np.int32),
                         boxes=z["in/boxes"].transpose(1, 0, 2), box_labels=z["in/box_labels"].T,
                         box_valid=(~z["in/box_mask"]).astype(np.int32))
            ref = {"pred_logits": z["out.pred_logits"][..., 0], "presence_logits": z["out.presence_logit_dec"],
                   "pred_boxes": z["out.pred_boxes_xyxy"], "pred_masks": z["out.pred_masks"]}
            c.compare_outputs(graph, f"Meta {case[len('box_grounding_'):]}", c.run(graph, feeds), ref)
    check_batching(c, graph, {"images": 3, "prompts": 3, "boxes": 4}, "I=3 P=3 K=4")
    check_batching(c, graph, {"images": 2, "prompts": 1, "boxes": 1}, "I=2 P=1 K=1",
                   broadcast=("text_features", "text_mask"))
    from . import detector

    dims = detector.Dims.from_sizes(c.model.sizes)
    feeds = {k: v.numpy() for k, v in detector.sample_inputs(detector.graph_specs(dims)[graph], dims,
                                                             {"images": 1, "boxes": 2}, seed=len(c.rows)).items()}
    padded = dict(feeds, boxes=np.concatenate([feeds["boxes"], np.full((1, 2, 4), 0.5, np.float32)], 1),
                  box_labels=np.concatenate([feeds["box_labels"], np.ones((1, 2), np.int32)], 1),
                  box_valid=np.concatenate([feeds["box_valid"], np.zeros((1, 2), np.int32)], 1))
    c.compare_outputs(graph, "K=2 padded to 4 vs K=2", c.run(graph, padded), c.torch_run(graph, feeds))


# ------------------------------------------------------------------------------------ tracker graphs
def _tracker_check(name: str):
    """Meta's composite tracker steps and module dumps when the bundle has the harness's seeded weights
    (graphs/sam31/tracker_check.py); otherwise the torch wrappers on seeded inputs. Batching and padding
    invariance either way."""
    def check(c: Sam31Checker) -> None:
        from . import tracker_check

        if c.meta is not None:
            c.rows += tracker_check.CHECKS[name](c.bundle, c.meta.modules)
        else:
            c.rows += tracker_check.check_against_torch(c.bundle, c.tracker, name)
            c.rows += tracker_check.check_batching_only(c.bundle, name)
    return check


def _register_tracker_checks() -> None:
    from .tracker_specs import GRAPHS

    for name in GRAPHS:
        register(name)(_tracker_check(name))


_register_tracker_checks()


# ----------------------------------------------------------------------------------- entry point
def run_checks(bundle: Path, checkpoint: Path | None = None, graphs=None, log=print) -> list[Row]:
    import torch

    checker = Sam31Checker(Path(bundle), checkpoint, log=log)
    names = graphs or list(checker.manifest["graphs"])
    missing = [n for n in names if n not in CHECKS]
    if missing:
        raise CheckError(f"no SAM 3.1 check is registered for graph(s) {missing} (graphs/sam31/check.py CHECKS)")
    with torch.no_grad():
        for name in names:
            CHECKS[name](checker)
    for note in checker.notes:
        log(note)
    log(HEADER)
    for r in checker.rows:
        log(r.line())
    return checker.rows
