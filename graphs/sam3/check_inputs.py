"""Random inputs for graphs/sam3/check.py and the one-object reference computations built on them.

``CheckInputs`` is a mixin of ``Checker``: its methods use the checker's ``torch``, ``model`` (the
transformers Sam3VideoModel), ``dims`` (specs.Dims) and ``gen`` (the seeded generator every random input
draws from, in call order).
"""

from __future__ import annotations

import numpy as np


class CheckInputs:
    """Random inputs and one-object references, drawn from ``self.gen`` (a mixin of ``Checker``)."""

    def image_features(self, images: int = 1):
        """Real backbone outputs of random images (the reference path), batch 1 each."""
        torch = self.torch
        m = self.model
        feats = []
        for _ in range(images):
            pixels = torch.rand(1, 3, self.dims.image_size, self.dims.image_size, generator=self.gen) * 2 - 1
            vision = m.detector_model.get_vision_features(pixel_values=pixels)
            trk_feats, trk_pos = m.get_vision_features_for_tracker(vision)
            feats.append((pixels, vision, trk_feats, trk_pos))
        return feats

    def tracker_head_np(self, trk_feats):
        """Reference tracker features (HW, 1, C) -> the graphs' [1, C, H, W] layout."""
        sizes = self.model.tracker_model.backbone_feature_sizes
        out = []
        for f, (h, w) in zip(trk_feats, sizes):
            out.append(f.permute(1, 2, 0).reshape(1, -1, h, w).numpy())
        return out

    def tracker_frame(self):
        """Tracker features of one random image: the reference's (HW, 1, C) levels and positions, and
        the same levels in the graphs' [1, C, H, W] layout."""
        _, _, trk_feats, trk_pos = self.image_features(1)[0]
        return trk_feats, trk_pos, self.tracker_head_np(trk_feats)

    def random_prompts(self, count):
        """``count`` rows of random token ids with random lengths (2..text_length) and their attention mask."""
        torch, d = self.torch, self.dims
        ids = torch.randint(0, d.vocab_size, (count, d.text_length), generator=self.gen)
        lengths = torch.randint(2, d.text_length + 1, (count,), generator=self.gen)
        mask = (torch.arange(d.text_length)[None] < lengths[:, None]).long()
        return ids, mask

    def reference_text(self, ids, mask):
        """The reference text encoder's output for each prompt row, batch 1 each."""
        get = self.model.detector_model.get_text_features
        return [get(input_ids=ids[i:i + 1], attention_mask=mask[i:i + 1]) for i in range(len(ids))]

    def memory_case(self, n, k, p, trk_feats, trk_pos):
        """Pools and padded indices for n objects with up to k memories and p pointers (object 0 uses
        every slot), and for each object a function giving its memory-conditioned pixel features the
        reference's way (tv: _prepare_memory_conditioned_features, one object with batch 1)."""
        torch = self.torch
        trk = self.model.tracker_model
        cfg = trk.config
        d = self.dims
        hw = d.grid * d.grid
        mem_pos = trk.memory_encoder.position_encoding((1, d.memory_channels, d.grid, d.grid), "cpu", torch.float32)
        mem_pos = mem_pos.flatten(2).permute(2, 0, 1)  # (HW, 1, Cm), as the reference stores maskmem_pos_enc
        counts_k = torch.randint(1, k + 1, (n,), generator=self.gen)
        counts_p = torch.randint(1, p + 1, (n,), generator=self.gen)
        counts_k[0], counts_p[0] = k, p
        pool = torch.randn(n * k, hw, d.memory_channels, generator=self.gen).to(torch.bfloat16).float()
        ptr_pool = torch.randn(n * p, d.channels, generator=self.gen)
        order_k, order_p = torch.randperm(n * k, generator=self.gen), torch.randperm(n * p, generator=self.gen)
        mem_index = np.zeros((n, k), np.int64)
        mem_slot = np.zeros((n, k), np.int64)
        mem_valid = np.zeros((n, k), bool)
        ptr_index = np.zeros((n, p), np.int64)
        ptr_offset = np.zeros((n, p), np.float32)
        ptr_valid = np.zeros((n, p), bool)
        max_ptr = cfg.max_object_pointers_in_encoder
        conditioned = []
        for i in range(n):
            ki, pi = int(counts_k[i]), int(counts_p[i])
            rows = order_k[i * k:i * k + ki]
            slots = torch.randint(0, cfg.num_maskmem, (ki,), generator=self.gen)
            slots[0] = cfg.num_maskmem - 1  # a conditioning frame
            offsets = torch.randint(-(max_ptr - 1), max_ptr, (pi,), generator=self.gen).tolist()
            offsets[0] = 0
            prow = order_p[i * p:i * p + pi]
            mem_index[i, :ki], mem_slot[i, :ki], mem_valid[i, :ki] = rows.numpy(), slots.numpy(), True
            ptr_index[i, :pi], ptr_valid[i, :pi] = prow.numpy(), True
            ptr_offset[i, :pi] = np.asarray(offsets, np.float32) / (max_ptr - 1)

            def reference(rows=rows, slots=slots, offsets=offsets, prow=prow):
                memories = [pool[r][:, None] for r in rows]
                # slot s holds temporal offset s+1; the reference indexes encodings with offset-1 (-1 for 0)
                positions = [mem_pos + trk.memory_temporal_positional_encoding[int(s)] for s in slots]
                pointers, pointer_pos = trk._process_object_pointers(
                    offsets, [ptr_pool[r][None] for r in prow], max_ptr, 1, d.channels, "cpu")
                memory = torch.cat(memories + [pointers])
                memory_pos = torch.cat([x.reshape(hw, 1, -1) for x in positions] + [pointer_pos])
                fused = trk.memory_attention(
                    current_vision_features=trk_feats[-1], memory=memory,
                    current_vision_position_embeddings=trk_pos[-1], memory_posision_embeddings=memory_pos,
                    num_object_pointer_tokens=pointers.shape[0])
                return fused.squeeze(1).transpose(1, 2).view(1, d.channels, d.grid, d.grid)

            conditioned.append(reference)
        feeds = dict(memory_pool=pool.numpy(), memory_index=mem_index, memory_slot=mem_slot, memory_valid=mem_valid,
                     pointer_pool=ptr_pool.numpy(), pointer_index=ptr_index, pointer_offset=ptr_offset,
                     pointer_valid=ptr_valid)
        return feeds, conditioned

    # The point prompts the interactive decoder is checked with: labels in the order the reference's
    # processor builds them (box corners 2 / 3 first, then clicks 1 positive / 0 negative).
    POINT_PROMPTS = {"click": [1], "clicks": [1, 0, 1, 0, 1], "box": [2, 3], "box+clicks": [2, 3, 1, 0]}

    def random_points(self, labels):
        """Coordinates [P, 2] in model-input pixels for one object's labels: corners of a real box (x0 <=
        x1, y0 <= y1) for labels 2 / 3, anywhere in the image for clicks."""
        torch, s = self.torch, self.dims.image_size
        coords = torch.rand(len(labels), 2, generator=self.gen) * (s - 1)
        if labels[:2] == [2, 3]:
            coords[:2] = torch.sort(coords[:2], dim=0).values
        return coords

    def interactive_reference(self, pix, high_res, coords, labels, multimask):
        """transformers' SAM head for one object with points (tv: _single_frame_forward, batch 1)."""
        torch = self.torch
        trk = self.model.tracker_model
        return trk._single_frame_forward(
            input_points=coords[None, None], input_labels=torch.tensor(labels, dtype=torch.int32)[None, None],
            image_embeddings=high_res + [pix], multimask_output=bool(multimask))

    def _tie_free_logits(self, n):
        """Mask logits for the thresholding path whose resized values stay clear of 0.

        A resized pixel within rounding distance of 0 is a tie: the reference (antialiased weights) and
        the graph (plain bilinear weights, equal up to ~1e-6) may threshold it either way. Two-valued
        blobs (+8 inside, -5 outside) cross 0 only between samples, never on one, at any image size,
        so the comparison fails on any real difference in thresholding.
        """
        from .specs import F_smooth

        torch, F, d = self.torch, self.torch.nn.functional, self.dims
        blobs = F_smooth(torch.randn(n, 1, d.mask_size, d.mask_size, generator=self.gen)) > 0.3
        logits = torch.where(blobs, 8.0, -5.0)
        image = F.interpolate(logits, size=(d.image_size, d.image_size), mode="bilinear", align_corners=False)
        memory = F.interpolate(image, size=(4 * d.mask_size,) * 2, mode="bilinear", align_corners=False)
        if float(memory.abs().min()) <= 1e-4:
            raise RuntimeError("sample mask logits have a resized pixel at 0; change the two values")
        return logits
