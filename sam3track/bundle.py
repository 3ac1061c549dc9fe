"""Opening a bundle: the manifest, its checks, and where each graph lives."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import BundleError

SUPPORTED_FORMAT = 1
REQUIRED_GRAPHS = ("text_encoder", "backbone", "grounding_head", "propagation_decoder", "memory_encoder",
                   "mask_init")


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's contents, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Bundle:
    root: Path
    manifest: dict

    @classmethod
    def open(cls, root, verify: bool = True) -> "Bundle":
        root = Path(root)
        path = root / "manifest.json"
        if not root.is_dir():
            raise BundleError(f"bundle directory {root} does not exist; export one with python -m graphs.export")
        if not path.is_file():
            raise BundleError(f"{root} has no manifest.json; it is not a sam3track bundle (python -m graphs.export)")
        try:
            manifest = json.loads(path.read_text())
        except ValueError as exc:
            raise BundleError(f"{path} is not valid JSON ({exc}); export the bundle again") from exc
        version = manifest.get("format_version")
        if not isinstance(version, int) or version > SUPPORTED_FORMAT:
            raise BundleError(f"{root} has bundle format {version}, newer than this sam3track reads "
                              f"({SUPPORTED_FORMAT}); upgrade sam3track or export with this version")
        bundle = cls(root, manifest)
        for name in REQUIRED_GRAPHS:
            if name not in manifest.get("graphs", {}):
                raise BundleError(f"{path} lists no graph {name!r}; export the bundle again")
            for file in [manifest["graphs"][name]["file"]] + manifest["graphs"][name].get("data_files", []):
                if not (root / file).is_file():
                    raise BundleError(f"graph {name} is missing: {root / file} does not exist; export the bundle again")
        if not (root / manifest["tokenizer"]["dir"] / "tokenizer.json").is_file():
            raise BundleError(f"{root} has no tokenizer/tokenizer.json; export the bundle again")
        if verify:
            bundle.verify()
        return bundle

    def verify(self) -> None:
        """Compare every graph and tokenizer file with its recorded sha256."""
        for name, g in self.manifest["graphs"].items():
            for file, expected in g["sha256"].items():
                if file_sha256(self.root / file) != expected:
                    raise BundleError(f"checksum mismatch for {self.root / file} (graph {name}): the file is "
                                      "corrupted or was changed; export the bundle again")
        tok = self.manifest["tokenizer"]
        for file, expected in tok.get("sha256", {}).items():
            if file_sha256(self.root / tok["dir"] / file) != expected:
                raise BundleError(f"checksum mismatch for {self.root / tok['dir'] / file}; export the bundle again")

    def graph_path(self, name: str) -> Path:
        return self.root / self.manifest["graphs"][name]["file"]

    @property
    def tokenizer_file(self) -> Path:
        return self.root / self.manifest["tokenizer"]["dir"] / "tokenizer.json"
