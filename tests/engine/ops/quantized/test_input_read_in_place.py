"""A plan's input read only by a calibrated quantize is read where the caller's array lies
(`Plan._fill_inputs`, `Workspace.reads_where_pointed`): no copy into the plan's buffer, the
logits the NumPy path's bit for bit; an array the quantize cannot read as it is (another
dtype, strided, fewer rows, one lying in the plan's own buffers) is copied in as before, and
after a run the quantize reads the plan's own buffer again."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import engine
from engine.kernels import int8_convert
from tests.engine.ops.quantized.int8_models import numpy_path
from tests.engine.quantize.test_int8_model import residual_net

pytestmark = pytest.mark.skipif(not int8_convert.available(),
                                reason="needs numba and the spin pool")

RNG = np.random.default_rng(83)
SHAPE = (2, 3, 16, 16)


def load() -> engine.Model:
    symbol, params = residual_net()
    calibration = RNG.standard_normal((16, 3, 16, 16)).astype(np.float32)
    return engine.load_model(symbol, params, precision="int8",
                             calibration={"data": calibration})


def images() -> np.ndarray:
    return RNG.standard_normal(SHAPE).astype(np.float32)


def exact_logits(model: engine.Model, data: np.ndarray) -> np.ndarray:
    with numpy_path():
        return model.infer({"data": data})["fc2_output"]


@pytest.fixture(scope="module")
def model() -> engine.Model:
    return load()


def plan_of(model: engine.Model) -> object:
    feed = {"data": images()}
    model.infer(feed)
    return model.plan_for(feed)


def input_buffer(plan: object) -> np.ndarray:
    ((name, buffer, _),) = plan._input_buffers
    assert name == "data"
    return buffer


def test_the_quantize_reads_the_callers_array_and_the_buffer_stays_as_it_was(model):
    plan = plan_of(model)
    (_, _, pointers), = plan._input_buffers
    assert len(pointers) == 1  # the quantize, the input's one reader
    first = images()
    plan.run({"data": first.astype(np.float64)})  # converted: copied into the buffer
    np.testing.assert_array_equal(input_buffer(plan), first)
    second = images()
    got = plan.run({"data": second})[0]
    np.testing.assert_array_equal(input_buffer(plan), first)  # not copied in
    np.testing.assert_array_equal(got, exact_logits(model, second))


@pytest.mark.parametrize("form", ["float64", "strided", "fewer rows"])
def test_an_array_not_readable_as_it_is_is_copied_in(model, form):
    plan = plan_of(model)
    data = images()
    fed = {"float64": lambda: data.astype(np.float64),
           "strided": lambda: np.repeat(data, 2, axis=3)[..., ::2],
           "fewer rows": lambda: data[:1]}[form]()
    assert not (fed.dtype == np.float32 and fed.flags.c_contiguous and fed.shape == SHAPE)
    got = plan.run({"data": fed})[0]
    want = np.zeros(SHAPE, np.float32)
    want[:len(fed)] = fed
    np.testing.assert_array_equal(input_buffer(plan), want)
    np.testing.assert_array_equal(got[:len(fed)], exact_logits(model, want)[:len(fed)])


def test_an_array_inside_the_plans_own_buffers_is_copied_in(model):
    plan = plan_of(model)
    data = images()
    start, end = max(plan._spans, key=lambda span: span[1] - span[0])
    assert end - start >= data.nbytes
    inside = np.ctypeslib.as_array(ctypes.cast(start, ctypes.POINTER(ctypes.c_float)),
                                   (data.size,)).reshape(SHAPE)
    np.copyto(inside, data)  # as an output of the last run fed back uncopied would lie
    got = plan.run({"data": inside})[0]
    np.testing.assert_array_equal(input_buffer(plan), data)
    np.testing.assert_array_equal(got, exact_logits(model, data))


def test_after_a_run_the_steps_read_the_plans_buffer_again(model):
    plan = plan_of(model)
    earlier = images()  # kept: a quantize left pointed at it would read its values
    plan.run({"data": earlier})
    data = images()
    np.copyto(input_buffer(plan), data)
    plan._run_on_cpu(plan._run_steps)  # the steps alone, as a staged caller runs them
    got = plan._heads[0].copy()
    np.testing.assert_array_equal(got, exact_logits(model, data))
    assert not np.array_equal(got, exact_logits(model, earlier))
