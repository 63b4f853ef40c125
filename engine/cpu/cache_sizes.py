"""The host's per-core cache sizes, read once per process from Linux's sysfs.

``/sys/devices/system/cpu/cpu0/cache/index*/`` holds one folder per cache the first core
sees, each with its ``level``, ``type`` and ``size`` (``512K``, ``32768K``, ``2M``). A host
without them (another system, a container hiding sysfs) answers None, and the callers keep
the choices they make without a size.
"""

from __future__ import annotations

import functools
from pathlib import Path

CACHE_FOLDER = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@functools.cache
def l2_bytes() -> int | None:
    """The first core's level-2 cache in bytes (data or unified), or None where unknown."""
    return level_bytes(2, CACHE_FOLDER)


def level_bytes(level: int, folder: Path) -> int | None:
    """The size of the data or unified cache at ``level`` listed under ``folder`` (one
    ``index*`` folder per cache, as sysfs lays them out), or None where none reads."""
    try:
        indices = sorted(folder.glob("index*"))
    except OSError:
        return None
    for index in indices:
        try:
            found = int((index / "level").read_text().strip())
            kind = (index / "type").read_text().strip()
            size = parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if found == level and kind in ("Data", "Unified") and size is not None:
            return size
    return None


def parse_size(text: str) -> int | None:
    """Bytes from sysfs's spelling of a cache size (``512K``, ``2M``, ``49152``), or None."""
    text = text.strip().upper()
    unit = text[-1:] if text[-1:] in _UNITS else ""
    digits = text[:-1] if unit else text
    if not digits.isdigit():
        return None
    return int(digits) * _UNITS[unit]
