"""Opening a bundle: the manifest, its checks, and where each graph lives.

A bundle is refused, with one message naming the file and the key at fault, when its manifest is
missing keys, has another format version, lists files that are missing or changed (sha256), or
describes geometry (image size, feature grid, widths) that the graphs themselves do not have.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from . import load_notice
from .errors import BundleError
from .families import family_of
from .hash_record import HashRecord

# 2: graph inputs are int32 / float32 (no int64 or bool); 3: interactive_decoder, memory_encoder's
# via_image, the tracker's multimask settings (older bundles lack them: export again)
SUPPORTED_FORMAT = 3
OM_MANIFEST = "om_manifest.json"  # written by `python -m om.convert` next to manifest.json
SUPPORTED_OM_FORMAT = 1


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's contents, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _lookup(manifest: dict, path: tuple[str, ...]):
    value = manifest
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


@dataclass
class Bundle:
    root: Path
    manifest: dict

    @classmethod
    def open(cls, root, verify: bool = True, cache=None) -> "Bundle":
        """cache: where the sha256s checked are recorded (user_cache.cache_folder's setting)."""
        root = Path(root)
        path = root / "manifest.json"
        if not root.is_dir():
            raise BundleError(f"bundle directory {root} does not exist; export one with python -m graphs.export")
        if not path.is_file():
            raise BundleError(f"{root} has no manifest.json; it is not a sam3track bundle (python -m graphs.export)")
        try:
            manifest = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise BundleError(f"{path} is not valid JSON ({exc}); export the bundle again") from exc
        if not isinstance(manifest, dict):
            raise BundleError(f"{path} holds no JSON object; export the bundle again")
        try:
            family = family_of(manifest)  # SAM 3 or SAM 3.1; any other family name is refused here
        except BundleError as exc:
            raise BundleError(f"{path}: {exc}") from None
        version = manifest.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise BundleError(f"{path} has format_version {version!r}, not a whole number; this sam3track reads "
                              f"format {SUPPORTED_FORMAT}: export the bundle again")
        if version > SUPPORTED_FORMAT:
            raise BundleError(f"{root} has bundle format {version}, newer than this sam3track reads "
                              f"({SUPPORTED_FORMAT}); upgrade sam3track or export with this version")
        if version < SUPPORTED_FORMAT:
            raise BundleError(f"{root} has bundle format {version}, older than this sam3track reads "
                              f"({SUPPORTED_FORMAT}); export the bundle again with this version")
        for key in family.required_keys:
            if _lookup(manifest, key) is None:
                raise BundleError(f"{path} has no {'.'.join(key)}; the manifest is incomplete: export the bundle again")
        graphs = manifest.get("graphs")
        if not isinstance(graphs, dict):
            raise BundleError(f"{path} lists no graphs; export the bundle again")
        bundle = cls(root, manifest)
        for name in family.required_graphs:
            entry = graphs.get(name)
            if not isinstance(entry, dict) or not all(k in entry for k in ("file", "sha256", "inputs", "outputs")):
                raise BundleError(f"{path} lists no complete graph {name!r} (file, sha256, inputs, outputs); "
                                  "export the bundle again")
            for file in [entry["file"]] + entry.get("data_files", []):
                if not (root / file).is_file():
                    raise BundleError(f"graph {name} is missing: {root / file} does not exist; export the bundle again")
        if not (root / manifest["tokenizer"]["dir"] / "tokenizer.json").is_file():
            raise BundleError(f"{root} has no tokenizer/tokenizer.json; export the bundle again")
        if family.check_geometry:  # SAM 3's geometry keys; a SAM 3.1 manifest describes its graphs otherwise
            bundle.check_geometry()
        if verify:
            bundle.verify(cache)
        return bundle

    def verify(self, cache=None) -> None:
        """Compare every graph and tokenizer file with its recorded sha256; files unchanged since a load
        checked them (size, times, inode: hash_record.py) are not read again."""
        tok = self.manifest["tokenizer"]
        files = [(self.root / file, expected, f" (graph {name})") for name, g in self.manifest["graphs"].items()
                 for file, expected in g["sha256"].items()]
        files += [(self.root / tok["dir"] / file, expected, "") for file, expected in tok.get("sha256", {}).items()]
        record = HashRecord(self.root, cache)
        todo = [path for path, _, _ in files if record.known(path) is None]
        size = sum(path.stat().st_size for path in todo if path.is_file())
        what = f"checking the sha256 of {len(todo)} files ({size / 1e9:.1f} GB) of {self.root}"
        with load_notice.step(what) if todo else contextlib.nullcontext():
            try:
                for path, expected, which in files:
                    if record.sha256(path, file_sha256) != expected:
                        raise BundleError(f"checksum mismatch for {path}{which}: the file is corrupted or was "
                                          "changed; export the bundle again")
            finally:
                record.save()

    # ----------------------------------------------------------------------------- geometry
    def expected_dims(self) -> dict[tuple[str, str], dict[int, int]]:
        """(graph, tensor) -> {axis: size} that the manifest's geometry implies."""
        m = self.manifest
        s = m["preprocessing"]["image_size"]
        trk = m["config"]["tracker"]
        g, c, cm, size = trk["feature_grid"], trk["hidden_dim"], trk["memory_dim"], trk["low_res_mask_size"]
        t, q = m["tokenizer"]["max_length"], m["config"]["detector"]["num_queries"]
        tracker_feat = {1: c, 2: g, 3: g}
        return {
            ("text_encoder", "input_ids"): {1: t},
            ("backbone", "pixel_values"): {1: 3, 2: s, 3: s},
            ("backbone", "tracker_feat"): tracker_feat,
            ("grounding_head", "text_mask"): {1: t},
            ("grounding_head", "pred_logits"): {1: q},
            ("grounding_head", "pred_masks"): {1: q, 2: size, 3: size},
            ("propagation_decoder", "tracker_feat"): tracker_feat,
            ("propagation_decoder", "memory_pool"): {1: g * g, 2: cm},
            ("propagation_decoder", "pointer_pool"): {1: c},
            ("propagation_decoder", "low_res_masks"): {2: size, 3: size},
            ("interactive_decoder", "tracker_feat"): tracker_feat,
            ("interactive_decoder", "memory_pool"): {1: g * g, 2: cm},
            ("interactive_decoder", "pointer_pool"): {1: c},
            ("interactive_decoder", "point_coords"): {2: 2},
            ("interactive_decoder", "low_res_masks"): {2: size, 3: size},
            ("memory_encoder", "mask_logits"): {2: size, 3: size},
            ("memory_encoder", "maskmem_features"): {1: g * g, 2: cm},
            ("mask_init", "masks"): {2: size, 3: size},
        }

    def check_geometry(self) -> None:
        """The manifest's geometry against the shapes it records for each graph's tensors."""
        listed = {(name, t["name"]): t.get("shape") for name, g in self.manifest["graphs"].items()
                  for t in list(g.get("inputs", [])) + list(g.get("outputs", []))}
        self._compare(listed, "the shapes it lists for the graphs")

    def check_graph_shapes(self, graphs: dict) -> None:
        """The manifest against the loaded graphs' own inputs and outputs (names and fixed sizes)."""
        actual = {}
        for name, graph in graphs.items():
            spec = self.manifest["graphs"][name]
            want_in = [t["name"] for t in spec["inputs"]]
            want_out = [t["name"] for t in spec["outputs"]]
            if sorted(graph.input_names) != sorted(want_in) or sorted(graph.output_names) != sorted(want_out):
                raise BundleError(f"graph {name} in {self.graph_path(name)} has inputs {list(graph.input_names)} and "
                                  f"outputs {list(graph.output_names)}, but the manifest lists {want_in} and "
                                  f"{want_out}; export the bundle again")
            actual.update({(name, k): v for k, v in graph.shapes.items()})
            for t in spec["inputs"] + spec["outputs"]:
                have = graph.shapes.get(t["name"])
                if have is None or len(have) != len(t["shape"]):
                    continue
                for axis, (a, b) in enumerate(zip(have, t["shape"])):
                    if isinstance(a, int) and isinstance(b, int) and a != b:
                        raise BundleError(f"graph {name} in {self.graph_path(name)}: {t['name']} has size {a} on "
                                          f"axis {axis}, the manifest says {b}; export the bundle again")
        if self.family.check_geometry:
            self._compare(actual, "the graph files")

    def _compare(self, shapes: dict, where: str) -> None:
        for (graph, tensor), axes in self.expected_dims().items():
            shape = shapes.get((graph, tensor))
            if shape is None:
                continue
            for axis, size in axes.items():
                have = shape[axis] if axis < len(shape) else None
                if isinstance(have, int) and have != size:
                    raise BundleError(f"{self.root / 'manifest.json'}: its geometry gives {graph}.{tensor} size {size} "
                                      f"on axis {axis}, but {where} give {have}; the manifest does not describe these "
                                      "graphs: export the bundle again")

    @property
    def family(self):
        return family_of(self.manifest)

    def graph_bytes(self, name: str | None = None) -> int:
        """The size on disk of graph `name`'s files (the graph and its weights), or of every graph's."""
        names = [name] if name is not None else list(self.manifest["graphs"])
        graphs = self.manifest["graphs"]
        files = [self.root / f for n in names for f in [graphs[n]["file"]] + list(graphs[n].get("data_files", []))]
        return sum(path.stat().st_size for path in files if path.is_file())

    def graph_path(self, name: str) -> Path:
        return self.root / self.manifest["graphs"][name]["file"]

    # ------------------------------------------------------------------------- OM bundles
    @cached_property
    def om_manifest(self) -> dict | None:
        """om_manifest.json of a bundle converted by `python -m om.convert`, None for a plain bundle
        (read once: every graph's load asks for its entry)."""
        path = self.root / OM_MANIFEST
        if not path.is_file():
            return None
        try:
            om = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise BundleError(f"{path} is not valid JSON ({exc}); convert the bundle again") from exc
        if not isinstance(om, dict) or om.get("format") != "sam3track-om" or not isinstance(om.get("graphs"), dict):
            raise BundleError(f"{path} is not a sam3track OM manifest; convert the bundle again (python -m om.convert)")
        if om.get("version") != SUPPORTED_OM_FORMAT:
            raise BundleError(f"{path} has OM manifest version {om.get('version')!r}; this sam3track reads "
                              f"{SUPPORTED_OM_FORMAT}: convert the bundle again")
        return om

    def compiled(self, name: str) -> dict | None:
        """Graph `name`'s entry in the OM manifest, with "root" (this directory) added; None for a
        plain bundle."""
        om = self.om_manifest
        if om is None:
            return None
        entry = om["graphs"].get(name)
        if not isinstance(entry, dict) or not isinstance(entry.get("axes"), dict):
            raise BundleError(f"{self.root / OM_MANIFEST} has no complete entry for graph {name}; convert the "
                              "bundle again (python -m om.convert)")
        return {**entry, "root": str(self.root), "soc_version": om.get("soc_version")}

    @property
    def tokenizer_file(self) -> Path:
        return self.root / self.manifest["tokenizer"]["dir"] / "tokenizer.json"
