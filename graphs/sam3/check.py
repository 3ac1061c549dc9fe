"""Check every graph of a SAM 3 bundle in onnxruntime against the transformers code it replaces.

References are the reference's own call paths with batch 1 (one prompt, one image, one object at a
time, exactly as Sam3VideoModel calls them), so batched and padded graph calls are checked against
one-at-a-time computation. Prints max absolute and relative error per output and exits non-zero when
any output is over tolerance (graphs/comparison.py: the rules and tolerances).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..comparison import (BF16_CRITERION, FP16_TOL, FP32_TOL, HEADER, INT8_TOL, CheckError, Row,
                         relative_error, within_one_bf16_step)
from .check_inputs import CheckInputs


def max_pointer_conditioning_frames() -> int:
    """Conditioning frames whose pointers one object attends to at most: the runtime's cap."""
    import dataclasses

    from sam3track.families.sam3.config import TrackerConfig

    return next(f.default for f in dataclasses.fields(TrackerConfig) if f.name == "max_conditioning_frames")


class Checker(CheckInputs):
    def __init__(self, bundle: Path, checkpoint: Path | None):
        import onnxruntime as ort
        import torch

        from .checkpoint import load_model
        from . import specs

        self.torch = torch
        self.bundle = bundle
        self.manifest = json.loads((bundle / "manifest.json").read_text())
        self._regenerated = None  # a temporary folder holding a rebuilt seeded checkpoint
        if checkpoint is None:
            source = self.manifest["source"]
            if source.get("checkpoint") is None:  # a seeded model left out of the bundle (the demo)
                checkpoint = self._regenerate_seeded_checkpoint(source)
            else:
                recorded = Path(source["checkpoint"])
                checkpoint = recorded if recorded.is_absolute() else bundle / recorded
        self.model = load_model(checkpoint)
        self.dims = specs.Dims.from_model(self.model)
        self.ort = ort
        self.sessions = {}
        self.rows: list[Row] = []
        self.gen = torch.Generator().manual_seed(1234)

    def _regenerate_seeded_checkpoint(self, source: dict) -> Path:
        """Rebuild the seeded small checkpoint the manifest names, and make sure it is the exported one."""
        import tempfile

        from .checkpoint import weights_sha256
        from .tiny import PRESETS, write_tiny_checkpoint

        seed, preset = source.get("tiny_seed"), source.get("tiny_preset") or "tiny"
        if seed is None or preset not in PRESETS:
            raise CheckError(f"{self.bundle / 'manifest.json'} records no checkpoint and no seeded model to "
                             f"rebuild; pass --checkpoint DIR (the snapshot the bundle was exported from)")
        self._regenerated = tempfile.TemporaryDirectory(prefix="sam3track-check-")
        checkpoint = write_tiny_checkpoint(Path(self._regenerated.name), seed=seed, preset=PRESETS[preset])
        if weights_sha256(checkpoint) != source.get("weights_sha256"):
            raise CheckError(
                f"the {preset} model rebuilt from seed {seed} has other weights than the ones "
                f"{self.bundle} was exported from (the preset or torch changed since); export the bundle "
                f"again: python -m graphs.export --{preset} --seed {seed} --out {self.bundle} --overwrite")
        return checkpoint

    def session(self, name):
        if name not in self.sessions:
            path = self.bundle / self.manifest["graphs"][name]["file"]
            self.sessions[name] = self.ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return self.sessions[name]

    def run(self, name, feeds):
        """Run a graph on feeds given in the reference's types (int64 ids, bool flags), converted to
        the types the graph takes, as the runtime converts them."""
        dtypes = {t["name"]: np.dtype(t["dtype"]) for t in self.manifest["graphs"][name]["inputs"]}
        return self.session(name).run(None, {k: np.ascontiguousarray(v, dtype=dtypes[k]) for k, v in feeds.items()})

    def compare(self, graph, case, names, got, ref, bf16_outputs=()):
        precision = self.manifest["graphs"][graph]["precision"]
        fp16 = precision != "fp32"  # bf16 steps are not the criterion of a reduced-precision graph
        tol = {"fp16": FP16_TOL, "int8": INT8_TOL}.get(precision, FP32_TOL)
        for name, g, r in zip(names, got, ref):
            r = np.asarray(r, dtype=np.float32)
            if g.shape != r.shape:
                self.rows.append(Row(graph, case, name, float("inf"), float("inf"), 0.0,
                                     f"FAIL shape {g.shape} != {r.shape}"))
                continue
            max_abs, rel = relative_error(g, r)
            if name in bf16_outputs and not fp16:
                within = within_one_bf16_step(g, r)
                self.rows.append(Row(graph, case, name, max_abs, rel, None, "" if within else "beyond one bf16 step",
                                     criterion=BF16_CRITERION, criterion_met=within))
            else:
                self.rows.append(Row(graph, case, name, max_abs, rel, tol))

    # ------------------------------------------------------------------------------------ graphs
    def check_text_encoder(self):
        torch = self.torch
        for count in (1, 2, 5):
            ids, mask = self.random_prompts(count)
            ref = torch.cat([t.pooler_output for t in self.reference_text(ids, mask)])
            got = self.run("text_encoder", {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
            self.compare("text_encoder", f"M={count}", ["text_features"], got, [ref.numpy()])

    def check_backbone(self):
        torch = self.torch
        for count in (1, 2, 3):
            feats = self.image_features(count)
            pixels = torch.cat([f[0] for f in feats]).numpy()
            got = self.run("backbone", {"pixel_values": pixels})
            ref = []
            for level in range(3):
                ref.append(np.concatenate([f[1].fpn_hidden_states[level].numpy() for f in feats]))
            heads = [self.tracker_head_np(f[2]) for f in feats]
            for level in range(3):
                ref.append(np.concatenate([h[level] for h in heads]))
            names = [o["name"] for o in self.manifest["graphs"]["backbone"]["outputs"]]
            self.compare("backbone", f"I={count}", names, got, ref)

    def check_grounding_head(self):
        torch, m = self.torch, self.model
        _, vision, _, _ = self.image_features(1)[0]
        for count in (1, 2, 5):
            ids, mask = self.random_prompts(count)
            text = self.reference_text(ids, mask)
            refs = [m.detector_model(vision_embeds=vision, text_embeds=text[i], attention_mask=mask[i:i + 1])
                    for i in range(count)]
            feeds = {f"detector_fpn{i}": vision.fpn_hidden_states[i].numpy() for i in range(3)}
            feeds["text_features"] = torch.cat([t.pooler_output for t in text]).numpy()
            feeds["text_mask"] = mask.numpy()
            got = self.run("grounding_head", feeds)
            ref = [torch.cat([getattr(r, k) for r in refs]).numpy()
                   for k in ("pred_logits", "presence_logits", "pred_boxes", "pred_masks")]
            self.compare("grounding_head", f"K={count}", ["pred_logits", "presence_logits", "pred_boxes", "pred_masks"],
                         got, ref)

    def memory_capacities(self):
        """The largest memories K and pointers P the runtime gathers for one object."""
        cfg = self.model.tracker_model.config
        k_max = cfg.max_cond_frame_num + cfg.num_maskmem - 1
        # The most pointers the runtime ever gathers: every kept conditioning frame (not only the
        # max_cond_frame_num selected for spatial memory) plus the non-conditioning window.
        p_max = cfg.max_object_pointers_in_encoder - 1 + max_pointer_conditioning_frames()
        return k_max, p_max

    def check_propagation_decoder(self):
        torch = self.torch
        trk = self.model.tracker_model
        d = self.dims
        trk_feats, trk_pos, head = self.tracker_frame()
        k_max, p_max = self.memory_capacities()
        cases = [(n, k, min(2 * k - 1, p_max)) for n in (1, 3, 8) for k in range(1, k_max + 1)]
        cases += [(3, k_max, p_max)]
        high_res = [torch.from_numpy(head[0]), torch.from_numpy(head[1])]
        for n, k, p in cases:
            feeds, conditioned = self.memory_case(n, k, p, trk_feats, trk_pos)
            refs = []
            for i in range(n):
                out = trk._single_frame_forward(image_embeddings=high_res + [conditioned[i]()],
                                                multimask_output=trk._use_multimask(False, None))
                refs.append([out.pred_masks.reshape(1, 1, d.mask_size, d.mask_size), out.iou_scores.reshape(1, -1),
                             out.object_score_logits.reshape(1, 1), out.object_pointer.reshape(1, -1)])
            feeds.update(tracker_feat_s0=head[0], tracker_feat_s1=head[1], tracker_feat=head[2])
            got = self.run("propagation_decoder", feeds)
            ref = [torch.cat([r[j] for r in refs]).numpy() for j in range(4)]
            self.compare("propagation_decoder", f"N={n} K={k} P={p}",
                         ["low_res_masks", "iou_scores", "object_score_logits", "object_pointer"], got, ref)

    def check_interactive_decoder(self):
        """Clicks and boxes per row: with use_memory=1 the one-object memory-conditioned reference (as
        for the propagation decoder); with use_memory=0 the current features + no_memory_embedding (an
        initial conditioning frame), whose memory inputs are all padding here. multimask 1 and 0 in every
        call; M = num_multimask_outputs columns of iou_scores, a single-mask row's one score in each."""
        torch = self.torch
        trk = self.model.tracker_model
        d = self.dims
        trk_feats, trk_pos, head = self.tracker_frame()
        high_res = [torch.from_numpy(head[0]), torch.from_numpy(head[1])]
        fresh = (trk_feats[-1] + trk.no_memory_embedding).permute(1, 2, 0).view(1, d.channels, d.grid, d.grid)
        k_max, p_max = self.memory_capacities()
        combos = [(1, 1), (0, 0), (1, 0), (0, 1)]  # (use_memory, multimask)
        cases = []
        for j, (prompt, labels) in enumerate(self.POINT_PROMPTS.items()):
            cases.append((prompt, labels, [combos[j]], 2, 3))  # one object: each combination once over the prompts
            cases.append((prompt, labels, [combos[(j + i) % 4] for i in range(4)], 3, 5))
        cases.append(("box+clicks", self.POINT_PROMPTS["box+clicks"], combos * 2, k_max, p_max))
        names = ["low_res_masks", "iou_scores", "object_score_logits", "object_pointer"]
        m = d.num_multimask_outputs
        for prompt, labels, rows, k, p in cases:
            n = len(rows)
            feeds, conditioned = self.memory_case(n, k, p, trk_feats, trk_pos)
            use_memory = np.array([u for u, _ in rows], bool)
            multimask = np.array([mm for _, mm in rows], bool)
            for i in np.flatnonzero(~use_memory):  # rows without memory: nothing but padding
                feeds["memory_valid"][i] = False
                feeds["pointer_valid"][i] = False
                feeds["memory_index"][i] = 0
                feeds["pointer_index"][i] = 0
            coords = torch.stack([self.random_points(labels) for _ in range(n)])
            refs = []
            for i in range(n):
                pix = conditioned[i]() if use_memory[i] else fresh
                out = self.interactive_reference(pix, high_res, coords[i], labels, multimask[i])
                iou = out.iou_scores.reshape(1, -1).expand(1, m)  # single-mask: one score in every column
                refs.append([out.pred_masks.reshape(1, 1, d.mask_size, d.mask_size), iou,
                             out.object_score_logits.reshape(1, 1), out.object_pointer.reshape(1, -1)])
            feeds.update(tracker_feat_s0=head[0], tracker_feat_s1=head[1], tracker_feat=head[2],
                         use_memory=use_memory, point_coords=coords.numpy(),
                         point_labels=np.tile(np.asarray(labels, np.int64), (n, 1)), multimask=multimask)
            got = self.run("interactive_decoder", feeds)
            ref = [torch.cat([r[j] for r in refs]).numpy() for j in range(4)]
            flags = ",".join(f"{int(u)}{int(mm)}" for u, mm in rows)
            # flags: use_memory and multimask of each row, e.g. "10,01" = row 0 memory + single mask, ...
            self.compare("interactive_decoder", f"{prompt} N={n} K={k} P={p} {flags}", names, got, ref)

    def check_memory_encoder(self):
        torch, trk, d = self.torch, self.model.tracker_model, self.dims
        trk_feats, _, head = self.tracker_frame()
        for n in (1, 3, 8):
            scores = torch.randn(n, 1, generator=self.gen) * 5
            for binarize in (False, True):
                feats = trk_feats[-1].expand(-1, n, -1)
                logits = masks = torch.randn(n, 1, d.mask_size, d.mask_size, generator=self.gen) * 8
                if binarize:  # the reference encodes image-size masks, thresholded, on frames with new objects
                    logits = self._tie_free_logits(n)
                    masks = torch.nn.functional.interpolate(logits, size=(d.image_size, d.image_size),
                                                            mode="bilinear", align_corners=False)
                ref, _ = trk._encode_new_memory(feats, masks, scores[:, :, None], is_mask_from_pts=binarize)
                # via_image changes nothing where binarize is set: that path always goes via the image size
                for via_image in (False, True) if binarize else (False,):
                    got = self.run("memory_encoder", dict(tracker_feat=head[2], mask_logits=logits.numpy(),
                                                          object_score_logits=scores.numpy(),
                                                          binarize=np.full((n,), binarize),
                                                          via_image=np.full((n,), via_image)))
                    self.compare("memory_encoder", f"N={n} binarize={binarize:d} via_image={via_image:d}",
                                 ["maskmem_features"], got, [ref.float().permute(1, 0, 2).numpy()],
                                 bf16_outputs=("maskmem_features",))
        self._check_memory_encoder_via_image(trk_feats, head)

    def _check_memory_encoder_via_image(self, trk_feats, head):
        """via_image=1: the low-res logits of the tracker's SAM head with points, against
        ``_encode_new_memory`` fed with the reference's own high_res_masks (the logits upsampled to the
        image size); the last object is absent (its masks NO_OBJ_SCORE, its score negative)."""
        from .modules import NO_OBJ_SCORE

        torch, trk, d = self.torch, self.model.tracker_model, self.dims
        high_res = [torch.from_numpy(head[0]), torch.from_numpy(head[1])]
        fresh = (trk_feats[-1] + trk.no_memory_embedding).permute(1, 2, 0).view(1, d.channels, d.grid, d.grid)
        for n in (1, 3):
            low, high, scores = [], [], []
            for i in range(n):
                labels = list(self.POINT_PROMPTS.values())[i % len(self.POINT_PROMPTS)]
                out = self.interactive_reference(fresh, high_res, self.random_points(labels), labels, i % 2 == 0)
                low.append(out.pred_masks.reshape(1, 1, d.mask_size, d.mask_size))
                high.append(out.high_res_masks.reshape(1, 1, d.image_size, d.image_size))
                scores.append(out.object_score_logits.reshape(1, 1))
            if n > 1:
                low[-1], high[-1] = torch.full_like(low[-1], NO_OBJ_SCORE), torch.full_like(high[-1], NO_OBJ_SCORE)
                scores[-1] = -scores[-1].abs() - 1
            low, high, scores = torch.cat(low), torch.cat(high), torch.cat(scores)
            ref, _ = trk._encode_new_memory(trk_feats[-1].expand(-1, n, -1), high, scores[:, :, None],
                                            is_mask_from_pts=False)
            got = self.run("memory_encoder", dict(tracker_feat=head[2], mask_logits=low.numpy(),
                                                  object_score_logits=scores.numpy(), binarize=np.zeros(n, bool),
                                                  via_image=np.ones(n, bool)))
            self.compare("memory_encoder", f"N={n} high_res_masks via_image=1", ["maskmem_features"], got,
                         [ref.float().permute(1, 0, 2).numpy()], bf16_outputs=("maskmem_features",))

    def check_mask_init(self):
        from .specs import F_smooth

        torch, trk, d = self.torch, self.model.tracker_model, self.dims
        _, _, head = self.tracker_frame()
        for n in (1, 3, 8):
            masks = (F_smooth(torch.randn(n, 1, d.mask_size, d.mask_size, generator=self.gen)) > 0.3)
            masks[-1] = False  # an empty detection mask: the object starts absent
            pix = torch.from_numpy(head[2])
            high_res = [torch.from_numpy(head[0]), torch.from_numpy(head[1])]
            # the session stores mask inputs in its float dtype before the tracker sees them
            refs = [trk._use_mask_as_output(pix, high_res, masks[i:i + 1].float()) for i in range(n)]
            got = self.run("mask_init", dict(tracker_feat=head[2], masks=masks.float().numpy()))
            ref = [torch.cat([r.pred_masks for r in refs]).numpy(),
                   torch.cat([r.object_pointer.reshape(1, -1) for r in refs]).numpy(),
                   torch.cat([r.object_score_logits.reshape(1, 1) for r in refs]).numpy()]
            self.compare("mask_init", f"N={n}", ["low_res_masks", "object_pointer", "object_score_logits"], got, ref)


def run_checks(bundle: Path, checkpoint: Path | None = None, graphs=None, log=print) -> list[Row]:
    import torch

    checker = Checker(Path(bundle), checkpoint)
    names = graphs or list(checker.manifest["graphs"])
    with torch.no_grad():
        for name in names:
            getattr(checker, f"check_{name}")()
    log(HEADER)
    for r in checker.rows:
        log(r.line())
    return checker.rows
