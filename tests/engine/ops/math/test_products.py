"""Products and sums: dot's N-d semantics, batch_dot, matmul, add_n."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ops import get_op
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(11)


def normal(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape).astype(np.float32)


@pytest.mark.parametrize(("lhs", "rhs", "ta", "tb"), [
    ((2, 3, 4), (4, 5), False, False),
    ((2, 3, 4), (4, 5, 6), False, False),
    ((4, 2, 3), (4, 5), True, False),
    ((2, 3, 4), (5, 6, 4), False, True),
    ((4,), (4, 5), False, False),
    ((3, 4), (4,), False, False),
])
def test_dot_nd_semantics(lhs: tuple, rhs: tuple, ta: bool, tb: bool) -> None:
    a, b = normal(*lhs), normal(*rhs)
    raw = {"transpose_a": str(ta), "transpose_b": str(tb)}
    (out,) = run("dot", raw, a, b)
    left = np.moveaxis(a, 0, -1) if ta else a        # contracted axis last
    right = np.moveaxis(b, -1, 0) if tb else b       # contracted axis first
    expected = np.tensordot(left, right, axes=([-1], [0]))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert infer("dot", raw, [lhs, rhs])[1] == [expected.shape]


def test_dot_partial_and_mismatch() -> None:
    assert infer("dot", {}, [(0, 4), (4, 5)])[1] == [(0, 5)]
    assert infer("dot", {}, [None, (4, 5)])[1] == [None]
    with pytest.raises(ShapeError, match="do not contract"):
        infer("dot", {"transpose_b": "True"}, [(3, 4), (4, 5)])


def test_batch_dot_matmul_np_dot() -> None:
    a, b = normal(2, 4, 3), normal(2, 4, 5)
    (out,) = run("batch_dot", {"transpose_a": "True"}, a, b)
    np.testing.assert_allclose(out, np.matmul(a.transpose(0, 2, 1), b), rtol=1e-5, atol=1e-5)
    assert infer("batch_dot", {"transpose_a": "True"}, [a.shape, b.shape])[1] == [(2, 3, 5)]
    c, d = normal(3, 1, 2, 4), normal(5, 4, 6)
    (out,) = run("_npi_matmul", {}, c, d)
    assert infer("_npi_matmul", {}, [c.shape, d.shape])[1] == [out.shape] == [(3, 5, 2, 6)]
    assert infer("_npi_matmul", {}, [(4,), (2, 4, 6)])[1] == [(2, 6)]
    e, f = normal(2, 3, 4), normal(5, 4, 6)
    (out,) = run("_np_dot", {}, e, f)
    assert infer("_np_dot", {}, [e.shape, f.shape])[1] == [out.shape] == [(2, 3, 5, 6)]


def test_add_n_writes_into_out() -> None:
    arrays = [normal(2, 3) for _ in range(4)]
    op = get_op("ElementWiseSum")
    attrs = op.parse_attrs({"num_args": "4"})
    assert op.input_names(attrs) == ("arg0", "arg1", "arg2", "arg3")
    target = np.empty((2, 3), np.float32)
    op.compute(np, attrs, arrays, out=target)
    np.testing.assert_allclose(target, sum(arrays), rtol=1e-6)
    assert not np.shares_memory(op.compute(np, attrs, arrays)[0], arrays[0])
