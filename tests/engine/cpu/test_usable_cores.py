"""The cores a process may keep busy (`engine.cpu.usable_cores`): a container's CPU limit read
from its control group, over cgroup trees written to disk as Docker, Compose and Kubernetes lay
them out, and in a real cgroup where this machine lets the tests make one."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from engine.cpu import blas_threads, usable_cores

REPO = Path(__file__).resolve().parents[3]


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_proc(tmp_path: Path, groups: str, mounts: str) -> Path:
    proc = tmp_path / "proc"
    write(proc / "cgroup", groups)
    write(proc / "mountinfo", mounts)
    return proc


def v2_mount(root: str, point: Path) -> str:
    return f"30 23 0:26 {root} {point} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def v1_mount(root: str, point: Path, options: str) -> str:
    return f"32 31 0:29 {root} {point} rw,relatime shared:9 - cgroup cgroup rw,{options}\n"


@pytest.mark.parametrize(("cpu_max", "quota", "cores"), [("250000 100000", 2.5, 2),
                                                         ("50000 100000", 0.5, 1)])
def test_a_v2_container_in_its_own_namespace_reads_its_cpu_max(
        tmp_path: Path, cpu_max: str, quota: float, cores: int) -> None:
    """Docker with a cgroup namespace (``--cpus 2.5``, ``--cpus 0.5``): the group is "/" and
    the mount's root; whole cores rounded down, and a quota under one core still one."""
    mount = tmp_path / "sys/fs/cgroup"
    write(mount / "cpu.max", f"{cpu_max}\n")
    proc = fake_proc(tmp_path, "0::/\n", v2_mount("/", mount))
    assert usable_cores.quota(proc) == pytest.approx(quota)
    assert usable_cores.quota_cores(proc) == cores


def test_the_smallest_limit_from_the_group_up_to_the_mount(tmp_path: Path) -> None:
    """Kubernetes on a cgroup v2 host without a namespace: the pod's group above the
    container's holds the tighter limit; groups that say "max" set none."""
    mount = tmp_path / "sys/fs/cgroup"
    pod = mount / "kubepods.slice/pod-a"
    write(mount / "kubepods.slice/cpu.max", "max 100000\n")
    write(pod / "cpu.max", "150000 100000\n")
    write(pod / "container-b/cpu.max", "400000 100000\n")
    proc = fake_proc(tmp_path, "0::/kubepods.slice/pod-a/container-b\n", v2_mount("/", mount))
    assert usable_cores.quota(proc) == pytest.approx(1.5)
    assert usable_cores.quota_cores(proc) == 1


def test_a_v1_container_sees_its_group_mounted_as_the_root(tmp_path: Path) -> None:
    """Docker on a cgroup v1 host: /proc/self/cgroup names the full path, the mount's root is
    that same path, and the files lie at the mount point; the cpu controller shares its
    hierarchy with cpuacct, and the path in mountinfo has an escaped space."""
    mount = tmp_path / "sys/fs/cgroup/cpu,cpuacct"
    write(mount / "cpu.cfs_quota_us", "300000\n")
    write(mount / "cpu.cfs_period_us", "100000\n")
    groups = ("12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n"
              "1:name=systemd:/docker/abc\n0::/\n")
    mounts = (v1_mount("/docker/abc", mount, "cpu,cpuacct")
              + v1_mount("/docker/abc", tmp_path / "sys/fs/cgroup/memory", "memory")
              + "25 1 8:1 / / rw - ext4 /dev/root rw\n")
    proc = fake_proc(tmp_path, groups, mounts)
    assert usable_cores.quota_cores(proc) == 3


def test_v1_without_a_quota_and_an_unlimited_host_say_none(tmp_path: Path) -> None:
    v1 = tmp_path / "v1"
    write(v1 / "cpu/cpu.cfs_quota_us", "-1\n")
    write(v1 / "cpu/cpu.cfs_period_us", "100000\n")
    proc = fake_proc(v1, "3:cpu:/\n", v1_mount("/", v1 / "cpu", "cpu"))
    assert usable_cores.quota(proc) is None and usable_cores.quota_cores(proc) is None
    v2 = tmp_path / "v2"
    write(v2 / "cgroup/cpu.max", "max 100000\n")
    proc = fake_proc(v2, "0::/user.slice\n", v2_mount("/", v2 / "cgroup"))
    assert usable_cores.quota_cores(proc) is None  # the group has no cpu.max: the root's says max


def test_what_cannot_be_read_is_no_limit(tmp_path: Path) -> None:
    """No /proc, a cpu.max that is not two numbers, a zero period: no limit, no error."""
    assert usable_cores.quota_cores(tmp_path / "nowhere") is None
    mount = tmp_path / "cgroup"
    write(mount / "cpu.max", "lots\n")
    write(mount / "a/cpu.max", "100000 0\n")
    proc = fake_proc(tmp_path, "0::/a\n", v2_mount("/", mount))
    assert usable_cores.quota_cores(proc) is None


def test_the_count_is_the_mask_at_most_the_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(usable_cores, "_CPUS", [0, 1, 2, 3])
    monkeypatch.setattr(usable_cores, "_NAMED", 4)
    for quota, count in ((None, 4), (2, 2), (1, 1), (8, 4)):
        monkeypatch.setattr(usable_cores, "_QUOTA", quota)
        assert usable_cores.count() == count
    assert usable_cores.cpus() == [0, 1, 2, 3]


def test_the_count_in_words_says_what_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(usable_cores, "_NAMED", 64)
    monkeypatch.setattr(usable_cores, "_QUOTA", None)
    assert usable_cores.describe() == "64 cores"
    monkeypatch.setattr(usable_cores, "_QUOTA", 2)
    monkeypatch.setattr(usable_cores, "_LIMIT", 2.5)
    assert usable_cores.describe() == "2 of 64 cores (the container's CPU limit, 2.5)"
    monkeypatch.setattr(usable_cores, "_NAMED", 1)
    assert usable_cores.describe() == "1 core"


class CountedBlas:
    """Stands in for numpy's OpenBLAS: the count it was set to."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def count(self) -> int:
        return self.threads

    def set(self, threads: int) -> None:
        self.threads = threads


def test_openblas_is_fitted_to_the_limit_unless_a_variable_chose_its_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in blas_threads.THREAD_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    for threads, limit, fitted in ((16, 2, 2), (16, None, 16), (2, 4, 2), (1, 1, 1)):
        blas = CountedBlas(threads)
        blas_threads.fit_to_limit(blas, limit)  # type: ignore[arg-type]
        assert blas.threads == fitted
    monkeypatch.setenv("OMP_NUM_THREADS", "16")  # the count was chosen: left as it is
    blas = CountedBlas(16)
    blas_threads.fit_to_limit(blas, 2)  # type: ignore[arg-type]
    assert blas.threads == 16


def make_v1_group(quota_us: int) -> Path | None:
    """A child of cgroup v1's cpu hierarchy with ``quota_us`` per 100 ms, where this process
    may make one."""
    root = Path("/sys/fs/cgroup/cpu")
    if not (root / "cpu.cfs_quota_us").exists() or not os.access(root, os.W_OK):
        return None
    group = root / f"hybridserve-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(quota_us))
    except OSError:
        if group.exists():
            group.rmdir()
        return None
    return group


def without_thread_variables() -> dict[str, str]:
    return {name: value for name, value in os.environ.items()
            if name not in blas_threads.THREAD_VARIABLES}


def test_a_process_in_a_real_cgroup_runs_the_threads_its_quota_pays_for() -> None:
    """A child process moved into a cgroup limited to one core says one core, and so do the
    engine's core counts and numpy's OpenBLAS, whatever its affinity mask names."""
    group = make_v1_group(100000)
    if group is None:
        pytest.skip("no cgroup v1 cpu hierarchy this process may write to")
    script = ("import os\n"
              "from engine.cpu import blas_threads, parallel, spin_pool, usable_cores\n"
              "blas = blas_threads.numpy_openblas()\n"
              "print(usable_cores.limit_cores(), usable_cores.count(), parallel.cores(),\n"
              "      spin_pool.cores(), 1 if blas is None else blas.count(),\n"
              "      len(usable_cores.cpus()) == len(os.sched_getaffinity(0)))")
    try:
        child = subprocess.run(
            [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
            timeout=120, check=True, env=without_thread_variables(),
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
    finally:
        group.rmdir()
    assert child.stdout.split() == ["1", "1", "1", "1", "1", "True"]
