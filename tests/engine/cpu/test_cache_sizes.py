"""The host's cache sizes as sysfs lists them."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.cpu import cache_sizes


@pytest.mark.parametrize(("text", "size"), [("512K\n", 512 << 10), ("2M", 2 << 20),
                                            ("32768K", 32 << 20), ("49152", 49152),
                                            ("", None), ("big", None), ("1.5M", None)])
def test_a_size_reads_in_sysfs_units(text: str, size: int | None) -> None:
    assert cache_sizes.parse_size(text) == size


def write_cache(folder: Path, index: int, level: int, kind: str, size: str) -> None:
    entry = folder / f"index{index}"
    entry.mkdir()
    for name, value in (("level", str(level)), ("type", kind), ("size", size)):
        (entry / name).write_text(value + "\n")


def test_the_level_two_cache_is_the_data_or_unified_one_at_level_two(tmp_path: Path) -> None:
    write_cache(tmp_path, 0, 1, "Data", "32K")
    write_cache(tmp_path, 1, 1, "Instruction", "32K")
    write_cache(tmp_path, 2, 2, "Unified", "512K")
    write_cache(tmp_path, 3, 3, "Unified", "32768K")
    assert cache_sizes.level_bytes(2, tmp_path) == 512 << 10
    assert cache_sizes.level_bytes(1, tmp_path) == 32 << 10
    assert cache_sizes.level_bytes(3, tmp_path) == 32 << 20


def test_a_host_without_the_listing_has_no_size(tmp_path: Path) -> None:
    assert cache_sizes.level_bytes(2, tmp_path / "absent") is None
    write_cache(tmp_path, 0, 2, "Instruction", "512K")
    assert cache_sizes.level_bytes(2, tmp_path) is None


def test_an_unreadable_entry_is_passed_over(tmp_path: Path) -> None:
    write_cache(tmp_path, 0, 2, "Unified", "lots")
    write_cache(tmp_path, 1, 2, "Unified", "1M")
    assert cache_sizes.level_bytes(2, tmp_path) == 1 << 20
