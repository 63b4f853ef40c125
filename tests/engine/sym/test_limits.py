"""The symbolic-mode limits: each error says why and names the alternative."""

from __future__ import annotations

import pytest

from engine import sym


@pytest.fixture
def x() -> sym.Symbol:
    return sym.var("x")


@pytest.mark.parametrize("attribute, alternative", [
    ("shape", "F.reshape"), ("dtype", "F.cast"), ("context", "load_model"),
    ("ctx", "load_model"), ("asnumpy", "load_model"),
])
def test_data_attributes_raise_attribute_error(x: sym.Symbol, attribute: str,
                                               alternative: str) -> None:
    with pytest.raises(AttributeError, match="describes computation, not data") as error:
        getattr(x, attribute)
    assert alternative in str(error.value)
    assert not hasattr(x, attribute)


def test_asnumpy_call_raises(x: sym.Symbol) -> None:
    with pytest.raises(AttributeError, match="asnumpy"):
        x.asnumpy()


@pytest.mark.parametrize("index", [slice(0, 1), (0, 1), 1.5, None])
def test_non_integer_index(x: sym.Symbol, index: object) -> None:
    with pytest.raises(TypeError, match="Symbol only support integer index to fetch i-th "
                                        "output") as error:
        x[index]
    assert "F.slice_axis" in str(error.value)


def test_item_assignment(x: sym.Symbol) -> None:
    with pytest.raises(TypeError, match="'Symbol' object does not support item assignment") as e:
        x[0] = 1
    assert "F.where" in str(e.value)


@pytest.mark.parametrize("operator", ["+=", "-=", "*=", "/=", "%=", "**="])
def test_in_place_operators_rejected(x: sym.Symbol, operator: str) -> None:
    namespace = {"x": x, "y": sym.var("y")}
    with pytest.raises(TypeError, match="in-place operator") as error:
        exec(f"x {operator} y", namespace)  # noqa: S102 - the statement is the subject
    assert f"x = x {operator[:-1]} y" in str(error.value)


def test_truth_value(x: sym.Symbol) -> None:
    with pytest.raises(TypeError, match="F.where"):
        if x > 0:
            pass
