"""The MXNet operator list as data: every forward name is registered or declared otherwise."""

from __future__ import annotations

import pytest

from engine.ops import all_ops, has_op
from engine.ops.catalog import STATUSES, load_operators, unsupported_reason
from engine.ops.coverage import coverage, main, report, synced

OPERATORS = load_operators()


def test_the_list_is_mxnet_191s_full_registry() -> None:
    assert len(OPERATORS) == 1167
    assert {"Convolution", "_contrib_box_nms", "_backward_Convolution", "Custom"} <= set(OPERATORS)


def test_every_record_has_a_known_status_and_reasons_where_needed() -> None:
    for name, record in OPERATORS.items():
        assert record["status"] in STATUSES, name
        if record["status"] in ("unsupported", "excluded"):
            assert record.get("reason", "").strip(), f"{name} is {record['status']} without reason"


def test_every_forward_name_is_registered_or_declared() -> None:
    undeclared = [name for name, record in OPERATORS.items()
                  if record["status"] == "supported" and not has_op(name)]
    assert undeclared == [], "listed as supported but not registered"
    unlisted = [name for name, record in OPERATORS.items()
                if has_op(name) and record["status"] != "supported"]
    assert unlisted == [], "registered but not marked supported: run coverage --write"


def test_the_file_is_in_sync_with_the_registry() -> None:
    assert synced(OPERATORS) == OPERATORS


def test_custom_is_unsupported_with_a_reason() -> None:
    assert "user Python code" in unsupported_reason("Custom")
    assert unsupported_reason("Convolution") is None
    assert unsupported_reason("NoSuchOp") is None


def test_coverage_counts_forward_names_only() -> None:
    records = {
        "a": {"status": "supported"}, "b": {"status": "todo"},
        "c": {"status": "unsupported", "reason": "r"}, "d": {"status": "excluded", "reason": "x"},
    }
    result = coverage(records)
    assert (result.covered, result.total, result.missing) == (1, 3, ("b",))
    assert result.unsupported == {"c": "r"}
    assert result.percent == pytest.approx(100 / 3)
    assert report(records).splitlines()[0] == "MXNet forward operators covered: 1/3 (33.3%)"


def test_synced_marks_registered_names_and_demotes_missing_ones() -> None:
    records = {"Convolution": {"status": "todo"}, "NoSuchOp": {"status": "supported"},
               "Other": {"status": "excluded", "reason": "x"}}
    assert synced(records) == {"Convolution": {"status": "supported"},
                               "NoSuchOp": {"status": "todo"},
                               "Other": {"status": "excluded", "reason": "x"}}


def test_command_prints_covered_total_and_the_missing(capsys: pytest.CaptureFixture[str]) -> None:
    main([])
    text = capsys.readouterr().out
    result = coverage(OPERATORS)
    assert f"covered: {result.covered}/{result.total}" in text
    assert all(f"\n  {name}\n" in text + "\n" for name in result.missing[:5])
    assert result.covered == sum(name in all_ops() for name, record in OPERATORS.items()
                                 if record["status"] != "excluded")
