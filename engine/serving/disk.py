"""The repository directory on disk: scanning, staging new versions, atomic moves, clean-up.

Layout: ``REPO/<model>/config.json`` (optional) and ``REPO/<model>/<version>/`` holding
``model-symbol.json``, ``model-0000.params`` and ``MANIFEST.json`` (written last). Entries whose
names start with ``.`` (staging ``.tmp-*`` and ``.trash-*`` directories) are never models.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from engine.serving.config import CONFIG_NAME
from engine.serving.errors import InvalidModel
from engine.serving.manifest import MODEL_FILES, fsync_dir, read_manifest
from engine.serving.names import MODEL_NAME, is_version_dir_name

log = logging.getLogger(__name__)

TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"


@dataclass(frozen=True)
class DiskVersion:
    """A version directory: its manifest digest (None while incomplete) or why it is unusable."""

    version: int
    manifest_digest: str | None
    problem: str | None = None


@dataclass(frozen=True)
class DiskModel:
    """A model directory: its config bytes (None if absent) and its version directories."""

    name: str
    config_bytes: bytes | None
    versions: dict[int, DiskVersion] = field(default_factory=dict)

    @property
    def config_digest(self) -> str | None:
        """sha256 of ``config.json`` (None when there is none)."""
        return config_digest(self.config_bytes)


def config_digest(config_bytes: bytes | None) -> str | None:
    """sha256 of a ``config.json``'s bytes (None for no config): part of a version's identity."""
    return None if config_bytes is None else hashlib.sha256(config_bytes).hexdigest()


def read_config_bytes(model_dir: Path) -> bytes | None:
    """The bytes of ``model_dir/config.json``, or None when there is no such file."""
    try:
        return (model_dir / CONFIG_NAME).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None


def scan(root: Path, *, require_manifest: bool = True) -> dict[str, DiskModel]:
    """Every model directory under `root` with its versions; cheap (reads no model files)."""
    models = {}
    for entry in _entries(root):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        if not MODEL_NAME.fullmatch(entry.name):
            log.warning("ignoring %s: not a valid model name", entry)
            continue
        models[entry.name] = scan_model(entry, require_manifest=require_manifest)
    return models


def scan_model(model_dir: Path, *, require_manifest: bool = True) -> DiskModel:
    """One model directory (see `scan`)."""
    versions = {}
    for entry in _entries(model_dir):
        if entry.is_dir() and is_version_dir_name(entry.name):
            versions[int(entry.name)] = _scan_version(entry, require_manifest)
    return DiskModel(model_dir.name, read_config_bytes(model_dir), versions)


def next_version(model_dir: Path) -> int:
    """One past the highest version directory of a model, complete or not (1 for none)."""
    numbers = [int(entry.name) for entry in _entries(model_dir)
               if entry.is_dir() and is_version_dir_name(entry.name)]
    return max(numbers, default=0) + 1


def _scan_version(version_dir: Path, require_manifest: bool) -> DiskVersion:
    version = int(version_dir.name)
    try:
        manifest = read_manifest(version_dir)
    except InvalidModel as error:
        return DiskVersion(version, None, str(error))
    if manifest is not None:
        return DiskVersion(version, manifest.digest)
    if not require_manifest and all((version_dir / name).is_file() for name in MODEL_FILES):
        stamp = "|".join(f"{name}:{(version_dir / name).stat().st_size}:"
                         f"{(version_dir / name).stat().st_mtime_ns}" for name in MODEL_FILES)
        return DiskVersion(version, "unmanifested:" + hashlib.sha256(stamp.encode()).hexdigest())
    return DiskVersion(version, None, f"{version_dir}: no MANIFEST.json yet (still being copied?)")


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def new_staging_dir(root: Path) -> Path:
    """A fresh ``REPO/.tmp-<uuid>`` directory for an upload."""
    path = root / f"{TMP_PREFIX}{uuid.uuid4().hex}"
    path.mkdir()
    return path


def write_file(path: Path, data: bytes | Path) -> None:
    """Write bytes (or copy a file) to `path` and fsync it."""
    with open(path, "wb") as stream:
        if isinstance(data, Path):
            with open(data, "rb") as source:
                shutil.copyfileobj(source, stream, 1 << 20)
        else:
            stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())


def move_into_place(staging: Path, target: Path) -> None:
    """Rename `staging` to `target` atomically; `FileExistsError` if `target` already exists."""
    target.parent.mkdir(exist_ok=True)
    try:
        os.rename(staging, target)  # fails on Linux when target is a non-empty directory
    except OSError as error:
        if target.exists():
            raise FileExistsError(str(target)) from error
        raise
    fsync_dir(target.parent)


def place_version(root: Path, staging: Path, target: Path, *, replace: bool) -> None:
    """Move a staged version to `target`; an existing `target` is swapped out when `replace`
    is set, else `FileExistsError` (another writer took that number)."""
    if replace and target.exists():
        replace_dir(root, staging, target)
    else:
        move_into_place(staging, target)


def remove_atomically(root: Path, path: Path) -> None:
    """Make `path` vanish in one rename (to ``REPO/.trash-*``), then delete it."""
    trash = root / f"{TRASH_PREFIX}{uuid.uuid4().hex}"
    os.rename(path, trash)
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


def remove_stale(root: Path, older_than_s: float) -> list[Path]:
    """Delete staging and trash directories untouched for `older_than_s` seconds."""
    removed = []
    now = time.time()
    for entry in _entries(root):
        if not entry.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
            continue
        try:
            age = now - entry.stat().st_mtime
        except FileNotFoundError:
            continue
        if age >= older_than_s:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def replace_dir(root: Path, staging: Path, target: Path) -> None:
    """Put `staging` at `target` and delete the old `target`; readers never see it missing.

    Linux swaps the two directories in one ``renameat2(RENAME_EXCHANGE)``; elsewhere the old
    directory is moved aside first, leaving a moment when `target` does not exist.
    """
    if _exchange(staging, target):
        fsync_dir(target.parent)
        shutil.rmtree(staging, ignore_errors=True)  # now holds the old version
        return
    trash = root / f"{TRASH_PREFIX}{uuid.uuid4().hex}"
    os.rename(target, trash)
    os.rename(staging, target)
    fsync_dir(target.parent)
    shutil.rmtree(trash, ignore_errors=True)


def _exchange(first: Path, second: Path) -> bool:
    """Atomically swap two paths with renameat2; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second),
                       rename_exchange)
    return result == 0


def remove_tree(path: Path) -> None:
    """Delete a directory tree if it exists."""
    shutil.rmtree(path, ignore_errors=True)
