"""What the tests of int8 plans share: a float model loaded in int8 on calibration rows, its
outputs with the compiled paths off (the NumPy path, the exact reference the fused kernels
must equal bit for bit), the compiled paths a run took, and its agreement with float32."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import engine
from engine import sym
from engine.ops.quantized import integer
from engine.ops.registry import get_op


def load_int8(symbol: Any, params: dict[str, np.ndarray],
              calibration: np.ndarray) -> engine.Model:
    """``symbol`` in int8, calibrated on ``calibration`` (the rows of input ``data``)."""
    return engine.load_model(symbol, params, precision="int8",
                             calibration={"data": calibration})


@contextmanager
def numpy_path() -> Iterator[None]:
    """The compiled int8 paths off inside the block (a model loaded or run there takes the
    NumPy path), on again after it."""
    integer.use_fast_path(False)
    try:
        yield
    finally:
        integer.use_fast_path(True)


def numpy_path_output(model: engine.Model, images: dict[str, np.ndarray],
                      output: str) -> np.ndarray:
    """``model``'s ``output`` on ``images`` with the compiled paths off."""
    with numpy_path():
        return model.infer(images)[output]


def paths_taken(run: Callable[[], Any]) -> tuple[Any, Counter]:
    """``run()``'s result and the compiled int8 paths it took (`integer.PATHS`' counts)."""
    before = Counter(integer.PATHS)
    result = run()
    taken = Counter(integer.PATHS)
    taken.subtract(before)
    return result, taken


def paths_matching_numpy(model: engine.Model, images: dict[str, np.ndarray],
                         output: str = "fc_output") -> tuple[np.ndarray, Counter]:
    """``model``'s ``output`` on ``images`` and the compiled paths the run took, the output
    asserted bit for bit the NumPy path's."""
    got, taken = paths_taken(lambda: model.infer(images)[output])
    np.testing.assert_array_equal(got, numpy_path_output(model, images, output))
    return got, taken


def preactivation_block(data: Any, after: str) -> Any:
    """A stem, then ResNet v2's pattern: BatchNorm and relu before a convolution, whose sum
    with the block's input BatchNorm and relu ``after``_bn and ``after``_relu read."""
    stem = sym.Convolution(data, num_filter=64, kernel=(3, 3), pad=(1, 1), no_bias=True,
                           name="stem")
    act = sym.Activation(sym.BatchNorm(stem, fix_gamma=False, eps=1e-5, name="b1_bn"),
                         act_type="relu", name="b1_relu")
    block = sym.Convolution(act, num_filter=64, kernel=(3, 3), pad=(1, 1), no_bias=True,
                            name="b1_conv") + stem
    return sym.Activation(sym.BatchNorm(block, fix_gamma=False, eps=1e-5, name=f"{after}_bn"),
                          act_type="relu", name=f"{after}_relu")


def assert_agrees_with_float32(model: engine.Model, images: dict[str, np.ndarray],
                               output: str) -> None:
    """Within 5% of the largest float32 output, and top-1 equal on 90% of the rows."""
    got = model.infer(images)[output]
    want = model.reference(images)[output]
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    assert np.mean(got.argmax(axis=1) == want.argmax(axis=1)) >= 0.9


def assert_bound_node_gives_numpys_bytes(op_name: str, params: Any, inputs: list[Any],
                                         path: str | None) -> None:
    """The op's bound calls take the compiled ``path`` once (any path where None) and write
    what its NumPy kernel computes, byte for byte."""
    op = get_op(op_name)
    want = op.compute(np, params, inputs)
    out = tuple(np.empty_like(part) for part in want)
    _, taken = paths_taken(lambda: [call() for call in op.bind_calls(np, params, inputs, out)])
    assert path is None or taken[path] == 1
    for got, expected in zip(out, want, strict=True):
        np.testing.assert_array_equal(got, expected)
