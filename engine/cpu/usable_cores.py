"""The cores this process may keep busy: those its affinity mask names, at most what its
control group's CPU quota pays for.

Docker's ``--cpus``, Compose's ``cpus`` and Kubernetes' ``limits.cpu`` give a container a quota
of CPU time per scheduling period, not fewer cores: its affinity mask still names every core of
the host. A process that sized its threads by the mask would run, on a 64-core node with a
limit of 2, 64 threads that spend the quota in a few milliseconds and then all wait for the
next period (100 ms by default). `count` is what the engine sizes its threads by
(`engine.cpu.parallel.cores`, the server's BLAS threads before numpy loads).

The quota is read from cgroup v2's ``cpu.max`` or cgroup v1's ``cpu.cfs_quota_us`` and
``cpu.cfs_period_us``, in the process's own group and every group above it up to the
hierarchy's mount (a limit may sit on a parent: a Kubernetes pod's group above its
containers'). Both are read once, as the module loads: the spin pool holds a running plan's
caller to one core (`engine.cpu.spin_pool`), whose own mask then names that core alone.
Standard library only.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath

ReadLimit = Callable[[Path], "float | None"]

PROC_SELF = Path("/proc/self")


def _mask() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return []


def quota_cores(proc: Path = PROC_SELF) -> int | None:
    """Whole cores the quota is worth, at least 1; None where no quota is set or none can be
    read. Rounded down: a run on one thread more than the quota pays for stalls every thread
    until the period ends, where one fewer only leaves part of a core unused."""
    return _whole_cores(quota(proc))


def _whole_cores(limit: float | None) -> int | None:
    return None if limit is None else max(1, math.floor(limit + 1e-9))


def quota(proc: Path = PROC_SELF) -> float | None:
    """CPU time per period this process may use, in cores (the smallest of its group's and
    its ancestors'), or None where none is set or the files cannot be read."""
    try:
        groups = (proc / "cgroup").read_text()
        mounts = (proc / "mountinfo").read_text()
    except OSError:  # not Linux, or no /proc
        return None
    limits = [limit for where, read in _cpu_groups(groups, mounts)
              for limit in _up_to_mount(where, read)]
    return min(limits, default=None)


def _cpu_groups(groups: str, mounts: str) -> list[tuple[tuple[Path, PurePosixPath], ReadLimit]]:
    """Each hierarchy holding the cpu controller: (its mount point and this process's group
    below it, the function reading one group's limit)."""
    found = []
    for mount_root, mount_point, kind, options in _cgroup_mounts(mounts):
        if kind == "cgroup2":
            path = _group_path(groups, lambda controllers: controllers == "")
            read: ReadLimit = _read_v2
        elif "cpu" in options.split(","):
            path = _group_path(groups, lambda controllers: "cpu" in controllers.split(","))
            read = _read_v1
        else:
            continue
        if path is not None:
            found.append(((Path(mount_point), _below(path, mount_root)), read))
    return found


def _cgroup_mounts(mounts: str) -> list[tuple[str, str, str, str]]:
    """(root, mount point, file system type, super options) of each cgroup mount in
    ``/proc/self/mountinfo`` (proc(5): the fields before " - " vary in number)."""
    found = []
    for line in mounts.splitlines():
        before, separator, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not separator or len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] in ("cgroup", "cgroup2"):
            found.append((_unescape(fields[3]), _unescape(fields[4]), tail[0], tail[2]))
    return found


def _group_path(groups: str, wanted: Callable[[str], bool]) -> PurePosixPath | None:
    """This process's group in the hierarchy whose controller list ``wanted`` accepts
    (``/proc/self/cgroup``: "id:controllers:path")."""
    for line in groups.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and wanted(parts[1]):
            return PurePosixPath(parts[2])
    return None


def _below(path: PurePosixPath, mount_root: str) -> PurePosixPath:
    """``path`` relative to the mount's root: a container sees its own group mounted as the
    root, and its path either as "/" (a cgroup namespace) or in full (without one)."""
    try:
        return path.relative_to(mount_root)
    except ValueError:
        return PurePosixPath(".")


def _up_to_mount(where: tuple[Path, PurePosixPath], read: ReadLimit) -> list[float]:
    """The limits set on the group and on each group above it, up to the mount point."""
    mount_point, relative = where
    limits = []
    for part in [relative, *relative.parents]:
        limit = read(mount_point / part)
        if limit is not None:
            limits.append(limit)
    return limits


def _read_v2(group: Path) -> float | None:
    """cgroup v2's ``cpu.max``: "QUOTA PERIOD" in microseconds, QUOTA "max" for none."""
    try:
        quota_text, period_text = (group / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota_text == "max":
        return None
    return _ratio(quota_text, period_text)


def _read_v1(group: Path) -> float | None:
    """cgroup v1's ``cpu.cfs_quota_us`` (-1 for none) over ``cpu.cfs_period_us``."""
    try:
        quota_text = (group / "cpu.cfs_quota_us").read_text().strip()
        period_text = (group / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return _ratio(quota_text, period_text)


def _ratio(quota_text: str, period_text: str) -> float | None:
    try:
        quota_us, period_us = int(quota_text), int(period_text)
    except ValueError:
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def _unescape(field: str) -> str:
    """A mountinfo path with its octal escapes (a space is written \\040) undone."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


_CPUS = _mask()
_NAMED = len(_CPUS) or os.cpu_count() or 1
_LIMIT = quota()
_QUOTA = _whole_cores(_LIMIT)


def cpus() -> list[int]:
    """The cores this process's mask named as it loaded (empty where the platform has none)."""
    return list(_CPUS)


def limit_cores() -> int | None:
    """`quota_cores` as read when the module loaded."""
    return _QUOTA


def count() -> int:
    """Cores this process may keep busy: its mask's, at most the quota's."""
    return _NAMED if _QUOTA is None else min(_NAMED, _QUOTA)


def describe() -> str:
    """`count` in words, with what set it: "2 cores", "2 of 64 cores (the container's CPU
    limit, 2.5)"."""
    cores = count()
    if cores == _NAMED:
        return f"{cores} core{'s' if cores != 1 else ''}"
    return f"{cores} of {_NAMED} cores (the container's CPU limit, {_LIMIT:g})"
