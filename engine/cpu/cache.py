"""Where generated kernel code and compile caches live: one directory, never the package tree.

By default the user's cache (``$XDG_CACHE_HOME/hybridserve``, else ``~/.cache/hybridserve``),
as numba's own ``NUMBA_CACHE_DIR`` works; `set_cache_dir` moves it (the service's
``--cache-dir``). Under it, ``kernel_jobs/`` holds the generated sources of kernel jobs and
``numba/`` numba's compiled functions (unless ``NUMBA_CACHE_DIR`` chooses numba's own place).
Nothing is written beside the installed modules: where the directory cannot be written, code is
compiled in each process instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_settings: dict[str, Path | None] = {"directory": None}


def default_cache_dir() -> Path:
    """The user's cache folder for this project."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hybridserve"


def cache_dir() -> Path:
    """The cache directory in use (`set_cache_dir`, else `default_cache_dir`)."""
    return _settings["directory"] or default_cache_dir()


def set_cache_dir(directory: str | os.PathLike[str] | None) -> None:
    """Keep generated code and compile caches under ``directory`` from now on (None: back to
    the default). What this process compiled already stays where it was cached."""
    _settings["directory"] = None if directory is None else Path(directory).expanduser()
    if "numba" in sys.modules:
        point_numba_here()


def folder(name: str) -> Path | None:
    """``cache_dir() / name``, created if needed; None where it cannot be written."""
    path = cache_dir() / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path if os.access(path, os.W_OK) else None


def point_numba_here() -> bool:
    """Send numba's disk cache under ours (numba reads ``config.CACHE_DIR`` whenever it looks
    for a place to cache a function), unless ``NUMBA_CACHE_DIR`` chose numba's own. Whether
    numba may cache at all: False where our directory cannot be written, so that numba never
    falls back to writing beside the module."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return True
    from numba.core import config

    numba_folder = folder("numba")
    config.CACHE_DIR = "" if numba_folder is None else str(numba_folder)
    return numba_folder is not None
