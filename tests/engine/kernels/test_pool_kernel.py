"""Compiled 2-D pooling (`engine.kernels.pool_kernel`) bound into plans agrees with the NumPy
binding and the reference interpreter, keeps NaN and -inf as they do, and stands aside where
it does not apply."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import engine
from engine import sym
from engine.cpu import compiled, spin_pool
from engine.kernels import jobs, pool_kernel
from tests.engine.runtime.helpers import step_funcs as plan_funcs

RNG = np.random.default_rng(23)
KERNELS = (pool_kernel.max_pool, pool_kernel.sum_pool)

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba not installed")
MEASURED_LIMITS = (pool_kernel.COMPILED_MIN_KERNEL, pool_kernel.COMPILED_MIN_OUT_WIDTH)


@pytest.fixture(autouse=True)
def compiled_at_every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled kernel for the small shapes of these tests, which it would leave to NumPy."""
    monkeypatch.setattr(pool_kernel, "COMPILED_MIN_KERNEL", 1)
    monkeypatch.setattr(pool_kernel, "COMPILED_MIN_OUT_WIDTH", 1)


# (data shape, kernel, stride, pad): kernels 2/3/5 and mixed, strides 1/2/3, pads 0/1/2, odd and
# even sizes, batches above 1, a window reaching past the input, and windows all padding.
GEOMETRIES = [
    ((1, 4, 12, 12), (3, 3), (2, 2), (1, 1)),  # ResNet's
    ((2, 3, 11, 9), (3, 3), (2, 2), (1, 1)),  # odd sizes: the last column in no pair
    ((3, 2, 8, 10), (2, 2), (2, 2), (0, 0)),
    ((2, 3, 7, 7), (3, 3), (1, 1), (1, 1)),
    ((1, 3, 9, 8), (5, 5), (1, 1), (2, 2)),
    ((2, 2, 13, 11), (5, 5), (3, 3), (2, 2)),
    ((1, 3, 10, 9), (2, 3), (3, 2), (1, 0)),
    ((2, 2, 9, 12), (3, 2), (1, 3), (0, 1)),
    ((1, 2, 6, 7), (3, 5), (2, 1), (2, 2)),
    ((2, 2, 5, 6), (2, 2), (3, 3), (2, 2)),  # pad as large as the kernel: windows in padding
    ((2, 2, 9, 12), (5, 3), (1, 2), (2, 1)),  # 3 wide, stride 2, windows of 3 to 5 rows
    ((1, 3, 3, 4), (3, 3), (2, 2), (1, 1)),
    ((1, 2, 1, 1), (3, 3), (1, 1), (1, 1)),
]
KINDS = [("max", None), ("avg", True), ("avg", False), ("sum", None)]


def pooling(kind: str, kernel: tuple, stride: tuple, pad: tuple, include: bool | None,
            convention: str = "valid"):
    attrs = {"kernel": kernel, "stride": stride, "pad": pad, "pool_type": kind,
             "pooling_convention": convention}
    if include is not None:
        attrs["count_include_pad"] = include
    return sym.Pooling(sym.var("data"), name="pool", **attrs)


def three_models(symbol) -> tuple:
    """(compiled binding, NumPy binding, reference interpreter) models of ``symbol``."""
    return (engine.load_model(symbol, optimize=True), engine.load_model(symbol, optimize=True),
            engine.load_model(symbol, optimize=False))


def step_funcs(model, data: np.ndarray) -> list:
    return plan_funcs(model.plan_for({"data": data}))


def three_outputs(models: tuple, data: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> list:
    """The three models' outputs for ``data``; the second's plan bound without numba."""
    compiled, numpy_bound, reference = models
    assert set(KERNELS) & set(step_funcs(compiled, data))
    with monkeypatch.context() as patch:
        patch.setattr("engine.cpu.compiled.available", lambda: False)
        assert not set(KERNELS) & set(step_funcs(numpy_bound, data))
        numpy_output = numpy_bound.infer({"data": data})["pool_output"]
    return [compiled.infer({"data": data})["pool_output"], numpy_output,
            reference.infer({"data": data})["pool_output"]]


def special_values(shape: tuple, dtype: type = np.float32) -> np.ndarray:
    """Random data with NaN and -inf on corners, edges and inside, and a plane all -inf."""
    data = RNG.normal(size=shape).astype(dtype)
    height, width = shape[2:]
    cells = [(0, 0), (height - 1, width - 1), (height // 2, width - 1), (height - 1, width // 2)]
    for index, (y, x) in enumerate(cells):
        data[index % shape[0], index % shape[1], y, x] = np.nan
    data[-1, 0, height // 2, width // 2] = -np.inf
    data[0, -1, 0, width - 1] = -np.inf
    data[-1, -1] = -np.inf
    return data


def assert_same(got: np.ndarray, want: np.ndarray, exact: bool) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if exact:  # a max picks one of its inputs: NaN where the other does, -inf where it does
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def bound_model(kind: str, kernel: tuple, stride: tuple, pad: tuple, include: bool | None,
                convention: str = "valid") -> tuple:
    return three_models(pooling(kind, kernel, stride, pad, include, convention))


@pytest.mark.parametrize("kind, include", KINDS, ids=["max", "avg-with-pad", "avg", "sum"])
@pytest.mark.parametrize("shape, kernel, stride, pad", GEOMETRIES,
                         ids=[f"{s[2]}x{s[3]}-k{k}-s{t}-p{p}" for s, k, t, p in GEOMETRIES])
def test_compiled_pooling_matches_numpy_binding_and_reference(
        shape: tuple, kernel: tuple, stride: tuple, pad: tuple, kind: str, include: bool | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    models = bound_model(kind, kernel, stride, pad, include)
    for data in (RNG.normal(size=shape).astype(np.float32), special_values(shape)):
        got, *others = three_outputs(models, data, monkeypatch)
        for want in others:
            assert_same(got, want, exact=kind == "max")


@pytest.mark.parametrize("kind, include", KINDS, ids=["max", "avg-with-pad", "avg", "sum"])
@pytest.mark.parametrize("pad", [(0, 0), (1, 1)])
def test_full_convention_windows_past_the_input(kind: str, include: bool | None, pad: tuple,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # 'full' rounds the output size up: the last windows reach past the padding.
    for shape, kernel, stride in (((2, 3, 8, 9), (3, 3), (2, 2)), ((1, 2, 7, 10), (2, 3), (3, 2))):
        models = bound_model(kind, kernel, stride, pad, include, "full")
        got, *others = three_outputs(models, special_values(shape), monkeypatch)
        for want in others:
            assert_same(got, want, exact=kind == "max")


def test_max_keeps_nan_wherever_it_falls_in_a_window(monkeypatch: pytest.MonkeyPatch) -> None:
    # One NaN per run at every cell of a small plane in turn: each window holding it is NaN
    # (np.maximum's rule), whichever row and column of the window it is, and no other window.
    compiled, _, reference = bound_model("max", (3, 3), (2, 2), (1, 1), None)
    for y, x in itertools.product(range(7), range(8)):
        data = RNG.normal(size=(1, 2, 7, 8)).astype(np.float32)
        data[0, 1, y, x] = np.nan
        got = compiled.infer({"data": data})["pool_output"]
        np.testing.assert_array_equal(got, reference.infer({"data": data})["pool_output"])
        rows = sum(2 * oy - 1 <= y <= 2 * oy + 1 for oy in range(4))  # windows holding it
        columns = sum(2 * ox - 1 <= x <= 2 * ox + 1 for ox in range(4))
        assert np.isnan(got[0, 1]).sum() == rows * columns
        assert not np.isnan(got[0, 0]).any()


@pytest.mark.parametrize("kind, include", KINDS, ids=["max", "avg-with-pad", "avg", "sum"])
def test_float64_runs_compiled(kind: str, include: bool | None,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    models = bound_model(kind, (3, 3), (2, 2), (1, 1), include)
    got, *others = three_outputs(models, special_values((2, 3, 9, 10), np.float64), monkeypatch)
    for want in others:
        assert_same(got, want, exact=kind == "max")


def test_second_run_reads_fresh_input(monkeypatch: pytest.MonkeyPatch) -> None:
    # The padding cells of the kernel's line buffers must still hold -inf on every run.
    compiled, _, reference = bound_model("max", (3, 3), (2, 2), (1, 1), None)
    for _ in range(3):
        data = -np.abs(RNG.normal(size=(2, 3, 10, 10))).astype(np.float32) - 1
        np.testing.assert_array_equal(compiled.infer({"data": data})["pool_output"],
                                      reference.infer({"data": data})["pool_output"])


# (data shape, dtype, Pooling attributes) the compiled kernel leaves to the NumPy binding.
NOT_COMPILED = {
    "float16": ((2, 3, 9, 8), np.float16, {}),
    "1-D": ((2, 3, 9), np.float32, {"kernel": (3,), "stride": (2,), "pad": (1,)}),
    "3-D": ((2, 3, 9, 8, 7), np.float32,
            {"kernel": (3, 3, 3), "stride": (2, 2, 2), "pad": (1, 1, 1)}),
    "NHWC": ((2, 9, 8, 3), np.float32, {"layout": "NHWC"}),
    "lp": ((2, 3, 9, 8), np.float32, {"pool_type": "lp", "p_value": 2}),
    "no numba": ((2, 3, 9, 8), np.float32, {}),
}


@pytest.mark.parametrize("case", list(NOT_COMPILED))
def test_numpy_binding_where_the_kernel_does_not_apply(case: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    shape, dtype, attrs = NOT_COMPILED[case]
    attrs = {"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1), "pool_type": "max", **attrs}
    symbol = sym.Pooling(sym.var("data"), name="pool", **attrs)
    if case == "no numba":
        monkeypatch.setattr("engine.cpu.compiled.available", lambda: False)
    data = RNG.normal(size=shape).astype(dtype)
    optimized = engine.load_model(symbol, optimize=True)
    assert not set(KERNELS) & set(step_funcs(optimized, data))
    reference = engine.load_model(symbol, optimize=False)
    np.testing.assert_allclose(optimized.infer({"data": data})["pool_output"],
                               reference.infer({"data": data})["pool_output"], rtol=1e-3)


@pytest.mark.parametrize("shape, kernel, compiled", [
    ((1, 8, 28, 28), (3, 3), True),  # 3 wide, output rows of 14
    ((1, 8, 12, 12), (3, 3), False),  # output rows of 6: short rows, NumPy's
    ((1, 8, 28, 28), (2, 2), False),  # 2 wide over a small plane: NumPy's few passes win
    ((1, 2, 112, 112), (2, 2), True),  # ... but not over a large one
])
def test_kernel_only_at_sizes_where_it_wins(shape: tuple, kernel: tuple, compiled: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_kernel, "COMPILED_MIN_KERNEL", MEASURED_LIMITS[0])
    monkeypatch.setattr(pool_kernel, "COMPILED_MIN_OUT_WIDTH", MEASURED_LIMITS[1])
    model = engine.load_model(pooling("max", kernel, (2, 2), (1, 1), None), optimize=True)
    data = RNG.normal(size=shape).astype(np.float32)
    assert (pool_kernel.max_pool in step_funcs(model, data)) == compiled
    np.testing.assert_array_equal(model.infer({"data": data})["pool_output"], engine.load_model(
        pooling("max", kernel, (2, 2), (1, 1), None), optimize=False).infer(
            {"data": data})["pool_output"])


def test_resnet_stem_pooling_binds_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_kernel, "COMPILED_MIN_KERNEL", MEASURED_LIMITS[0])
    monkeypatch.setattr(pool_kernel, "COMPILED_MIN_OUT_WIDTH", MEASURED_LIMITS[1])
    # ResNet v1's stem: 7×7 stride-2 convolution, ReLU, then the 3×3 stride-2 pad-1 max pooling.
    data = sym.var("data")
    stem = sym.Convolution(data, kernel=(7, 7), stride=(2, 2), pad=(3, 3), num_filter=8,
                           name="stem")
    net = sym.Pooling(sym.relu(stem), kernel=(3, 3), stride=(2, 2), pad=(1, 1),
                      pool_type="max", name="pooling0")
    args, _, _ = net.infer_shape(data=(1, 3, 64, 64))
    params = {name: RNG.normal(size=shape).astype(np.float32)
              for name, shape in zip(net.list_arguments(), args) if name != "data"}
    optimized = engine.load_model(net, params, optimize=True)
    reference = engine.load_model(net, params, optimize=False)
    x = RNG.normal(size=(1, 3, 64, 64)).astype(np.float32)
    plan = optimized.plan_for({"data": x})
    pooling_calls = [step.call for step in plan.steps if step.node.name == "pooling0"]
    assert [jobs.source(call).func for call in pooling_calls] == [pool_kernel.max_pool]
    if spin_pool.available():  # the pass runs as a job of parts over the planes
        assert isinstance(pooling_calls[0], spin_pool.Job)
    np.testing.assert_allclose(optimized.infer({"data": x})["pooling0_output"],
                               reference.infer({"data": x})["pooling0_output"], rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("kernel, stride, pad", [((3, 3), (2, 2), (1, 1)),  # the pairs kernel
                                                  ((3, 3), (1, 1), (1, 1)),
                                                  ((5, 3), (2, 3), (2, 0))])
def test_max_pooling_split_over_planes_equals_one_pass(kernel: tuple, stride: tuple,
                                                       pad: tuple) -> None:
    """`MaxPoolCall`'s job, in parts on two threads and as one part alone, writes every plane
    as `max_pool` over all of them does."""
    if not spin_pool.available():
        pytest.skip("the spin pool's native code does not compile here")
    data = special_values((1, 37, 30, 28)).reshape(37, 30, 28)  # planes, H, W
    out_shape = tuple((size + 2 * p - k) // s + 1
                      for size, k, s, p in zip(data.shape[1:], kernel, stride, pad))
    want = np.full((37, *out_shape), np.nan, np.float32)
    pool_kernel.max_pool(data, want, *kernel, *stride, *pad)
    got = np.full_like(want, np.nan)
    call = pool_kernel.MaxPoolCall(pool_kernel.max_pool, data, got, *kernel, *stride, *pad)
    job = call.as_job(None)
    assert isinstance(job, spin_pool.Job) and job.args[-1] > 1
    for threads in (2, 1):
        got[:] = np.nan
        with spin_pool.armed(threads):
            job()
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("shape, kernel, stride, pad", [
    ((12, 12), (3, 3), (2, 2), (1, 1)), ((11, 9), (3, 3), (2, 2), (1, 1)),
    ((9, 12), (3, 2), (1, 3), (0, 1)), ((13, 11), (5, 5), (3, 3), (2, 2))])
def test_max_of_infinities_and_nan_windows(batch: int, shape: tuple, kernel: tuple,
                                           stride: tuple, pad: tuple,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Windows holding +inf beside -inf stay +inf (a NaN taken from the cells' sum would make
    # them NaN), windows with a NaN beside either infinity or another NaN stay NaN.
    models = bound_model("max", kernel, stride, pad, None)
    data = RNG.choice(np.array([np.inf, -np.inf, 1.0, -2.0], np.float32), size=(batch, 2, *shape))
    data[-1, -1].flat[::7] = np.nan
    got, numpy_output, reference = three_outputs(models, data, monkeypatch)
    infinite = np.isposinf(got)
    assert infinite.any() and np.isnan(got).any()
    assert_same(got, numpy_output, exact=True)
    assert_same(got, reference, exact=True)
    assert not np.isnan(got[:-1]).any() and not np.isnan(got[-1, :-1]).any()
