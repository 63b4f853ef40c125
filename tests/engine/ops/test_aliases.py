"""MXNet names registered as aliases: each resolves to its target and is checked against MXNet."""

from __future__ import annotations

import pytest

from engine.ops import get_op
from engine.ops.aliases import load_aliases
from engine.ops.catalog import load_operators, mxnet_saved_name
from engine.ops.registry import register_alias
from tests.conformance.fixtures import op_cases

ALIASES = load_aliases()
OPERATORS = load_operators()


def test_every_alias_resolves_to_its_target_record() -> None:
    assert ALIASES, "the alias file lists names"
    for alias, target in ALIASES.items():
        assert get_op(alias) is get_op(target), alias


def test_aliases_are_mxnet_aliases_or_have_mxnet_cases() -> None:
    case_ops = {case["op"] for case in op_cases()}
    for alias, target in ALIASES.items():
        if OPERATORS[alias].get("alias_of") == target:
            continue  # the same op inside MXNet
        assert alias in case_ops, f"{alias} behaves like {target} only on MXNet's say-so: no case"


def test_saved_name_follows_mxnet() -> None:
    assert mxnet_saved_name("_npx_slice") == "slice"
    assert mxnet_saved_name("_contrib_box_non_maximum_suppression") == "_contrib_box_nms"
    assert mxnet_saved_name("_npi_add") == "_npi_add"  # an op of its own in MXNet
    assert mxnet_saved_name("_fused_elementwise") is None  # the engine's own name


def test_register_alias_refuses_a_taken_name() -> None:
    with pytest.raises(ValueError, match=r"'relu' is registered twice"):
        register_alias("relu", "sigmoid")
