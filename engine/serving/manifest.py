"""`MANIFEST.json` of a model version: names, sizes and sha256 of its files, written last.

A version directory without a manifest is still being copied and is never loaded; one whose
files differ from its manifest is refused. ``python -m engine.serving.manifest DIR`` writes the
manifest of a directory filled by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from engine.serving.errors import InvalidModel

MANIFEST_NAME = "MANIFEST.json"
SYMBOL_NAME = "model-symbol.json"
PARAMS_NAME = "model-0000.params"
MODEL_FILES = (SYMBOL_NAME, PARAMS_NAME)
FORMAT_VERSION = 1
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileEntry:
    """One file of a version: its name inside the version directory, size and sha256 (hex)."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """The files of one version, and the sha256 of the manifest's own bytes (its identity)."""

    files: tuple[FileEntry, ...]
    digest: str = ""

    def to_bytes(self) -> bytes:
        """The JSON written to disk."""
        files = [{"name": e.name, "size": e.size, "sha256": e.sha256} for e in self.files]
        return json.dumps({"format": FORMAT_VERSION, "files": files}, indent=2).encode() + b"\n"


def hash_file(path: Path) -> FileEntry:
    """Size and sha256 of one file."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return FileEntry(path.name, size, digest.hexdigest())


def fsync_dir(directory: Path) -> None:
    """Flush a directory entry so that renames and creations inside it survive a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_durably(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary sibling, fsync it, then rename into place."""
    temporary = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    with open(temporary, "wb") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temporary, path)
    fsync_dir(path.parent)


def write_manifest(directory: Path, names: tuple[str, ...] = MODEL_FILES) -> Manifest:
    """Hash the named files of `directory` and write its manifest (last, durably)."""
    files = tuple(hash_file(directory / name) for name in names)
    manifest = Manifest(files)
    data = manifest.to_bytes()
    write_bytes_durably(directory / MANIFEST_NAME, data)
    return Manifest(files, hashlib.sha256(data).hexdigest())


def read_manifest(directory: Path) -> Manifest | None:
    """The manifest of a version directory, or None when it has none (not yet complete).

    Raises:
        InvalidModel: the manifest exists but is malformed.
    """
    path = directory / MANIFEST_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        raw = json.loads(data)
        files = tuple(_entry(item) for item in raw["files"])
        if raw.get("format") != FORMAT_VERSION:
            raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT_VERSION}")
    except (ValueError, KeyError, TypeError) as error:
        raise InvalidModel(f"{path}: malformed manifest: {error}") from None
    return Manifest(files, hashlib.sha256(data).hexdigest())


def _entry(item: dict[str, object]) -> FileEntry:
    name, size, sha256 = item["name"], item["size"], item["sha256"]
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"file name {name!r} must be a plain name inside the version directory")
    if not isinstance(size, int) or size < 0:
        raise ValueError(f"file {name!r}: size {size!r} must be a non-negative integer")
    if not isinstance(sha256, str) or len(sha256) != 64:
        raise ValueError(f"file {name!r}: sha256 {sha256!r} must be 64 hex digits")
    return FileEntry(name, size, sha256.lower())


def verify_manifest(directory: Path, manifest: Manifest) -> None:
    """Check every file against the manifest; raise `InvalidModel` naming the first mismatch."""
    for expected in manifest.files:
        path = directory / expected.name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise InvalidModel(f"{path}: listed in {MANIFEST_NAME} but missing") from None
        if size != expected.size:
            raise InvalidModel(f"{path}: size {size} bytes, but {MANIFEST_NAME} says "
                               f"{expected.size}; the version is incomplete or was modified")
        actual = hash_file(path)
        if actual.sha256 != expected.sha256:
            raise InvalidModel(f"{path}: sha256 {actual.sha256}, but {MANIFEST_NAME} says "
                               f"{expected.sha256}; the version was modified after it was written")


def main(argv: list[str]) -> int:
    """Write the manifest of each version directory given on the command line."""
    if not argv:
        print("usage: python -m engine.serving.manifest VERSION_DIR...", file=sys.stderr)
        return 2
    for argument in argv:
        manifest = write_manifest(Path(argument))
        print(f"{argument}: {len(manifest.files)} files, manifest sha256 {manifest.digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
