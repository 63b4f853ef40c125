"""What the host CPU offers (`engine.cpu.host_features`): flags read once, agreeing with LLVM's
view of the host, and AMX's tile state asked of Linux."""

from __future__ import annotations

import pytest

from engine.cpu import host_features


def test_flags_agree_with_llvms_view_of_the_host() -> None:
    llvm = pytest.importorskip("llvmlite.binding")
    host = llvm.get_host_cpu_features()
    for ours, theirs in host_features._LLVM_NAMES.items():
        # A hypervisor may hide a feature from one view; where both name it, they agree.
        if theirs in host:
            assert host_features.has(ours) == bool(host[theirs]), ours


def test_the_procfs_and_llvm_readings_name_the_same_features() -> None:
    from_procfs = host_features._cpuinfo_flags()
    if from_procfs is None:
        pytest.skip("no /proc/cpuinfo on this host")
    from_llvm = host_features._llvm_flags()
    assert from_llvm <= from_procfs | {"avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}
    assert {name for name in host_features._LLVM_NAMES if name in from_procfs} >= from_llvm


def test_bf16_needs_avx512_and_its_bf16_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    for flags, expected in (({"avx512f", "avx512_bf16"}, True), ({"avx512f"}, False),
                            ({"avx512_bf16"}, False)):
        monkeypatch.setattr(host_features, "flags", lambda flags=flags: frozenset(flags))
        assert host_features.bf16_dot_product() is expected


def test_amx_is_asked_of_linux_once_and_only_with_the_flags(
        monkeypatch: pytest.MonkeyPatch) -> None:
    granted = host_features.amx_permitted()
    assert granted is host_features.amx_permitted()
    if host_features.has("amx_tile") and host_features.has("amx_bf16"):
        assert granted, "Linux refused ARCH_REQ_XCOMP_PERM on a CPU with AMX"
    host_features.amx_permitted.cache_clear()
    try:
        monkeypatch.setattr(host_features, "flags", lambda: frozenset({"avx512f"}))
        assert host_features.amx_permitted() is False
    finally:
        host_features.amx_permitted.cache_clear()
    monkeypatch.undo()
    assert host_features.amx_permitted() is granted
    assert set(host_features.summary()) == set(host_features._LLVM_NAMES)
