"""Compiled plans: no allocation in steady state, memory reuse, agreement with the reference."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import engine
from engine import sym
from engine.cpu import denormals
from engine.runtime.plan import Plan, Step
from engine.runtime.signature import Signature
from tests.conformance.fixtures import model_files, model_io_sets
from tests.engine.compiler.graphs import conv_bn_relu, mlp
from tests.engine.runtime.helpers import run_allocation


@pytest.mark.parametrize("rows", [1, 256])
def test_steady_state_run_allocates_no_arrays(rows: int) -> None:
    graph, _ = mlp()
    plan = Plan(graph, {"data": (rows, 512)}, {"data": np.dtype(np.float32)})
    feed = {"data": np.random.default_rng(0).normal(size=(rows, 512)).astype(np.float32)}
    # Python's own small-object caches keep up to about 12 KB of a step's short-lived objects
    # over a process's first tens of runs (a bounded set, measured with tracemalloc: none
    # kept past 50 runs), which the check below would otherwise count when it runs first.
    peak, kept = run_allocation(plan, feed, 20, warm_runs=50)
    # At 256 rows the smallest activation is 128 KiB; a run may only use numpy's fixed
    # ufunc scratch buffer (at most 8192 elements, for broadcasting the bias) and small objects.
    assert peak < 48 * 1024, f"a run allocated up to {peak} bytes"
    assert kept < 8 * 1024  # nothing kept: 20 leaked activations would be 2.5 MiB


def test_memory_plan_reuses_buffers_on_resblock() -> None:
    model = engine.load_model(*model_files("resblock"))
    inputs, expected = model_io_sets("resblock")[0]
    np.testing.assert_allclose(list(model.infer(inputs).values())[0], expected[0],
                               rtol=1e-4, atol=1e-5)
    plan = model.stats()["plans"][0]
    assert plan["planned_activation_bytes"] <= 0.5 * plan["naive_activation_bytes"]


def test_memory_plan_without_reuse_gives_every_value_its_own_buffer() -> None:
    graph, _ = conv_bn_relu()
    shapes = {"data": (1, 2, 5, 5)}
    dtypes = {"data": np.dtype(np.float32)}
    naive = Plan(graph, shapes, dtypes, reuse_memory=False).memory
    planned = Plan(graph, shapes, dtypes).memory
    assert naive.planned_bytes == naive.naive_bytes
    assert planned.planned_bytes < naive.planned_bytes


def test_inplace_ops_reuse_their_input_buffer() -> None:
    graph, _ = conv_bn_relu()
    plan = Plan(graph, {"data": (1, 2, 5, 5)}, {"data": np.dtype(np.float32)})
    by_name = {(graph.nodes[index].name, slot): buffer
               for (index, slot), buffer in plan.memory.buffer_of.items()}
    assert by_name[("relu", 0)] == by_name[("bn", 0)]


def test_optimized_plan_stats_and_profile() -> None:
    model = engine.load_model(*model_files("lenet"))
    inputs, _ = model_io_sets("lenet")[0]
    model.infer(inputs)
    stats = model.stats()
    assert stats["optimized_nodes"] < stats["nodes"]  # BatchNorm folded, epilogues fused
    profile = model.profile(inputs, repeat=2)
    assert "Convolution+Activation" in profile and all(t >= 0 for t in profile.values())


def test_plans_are_cached_per_signature_and_bucketed() -> None:
    symbol, params = model_files("seed_mlp")
    model = engine.runtime.Model(engine.runtime.loader.read_graph(symbol),
                                 engine.runtime.loader.read_params(params),
                                 batch_buckets=(4, 8))
    reference = engine.load_model(symbol, params, optimize=False)
    rng = np.random.default_rng(1)
    for rows in (1, 3, 4, 7, 8, 9):
        data = rng.normal(size=(rows, 512)).astype(np.float32)
        got = list(model.infer({"data": data}).values())[0]
        want = list(reference.infer({"data": data}).values())[0]
        assert got.shape == (rows, 2)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    signatures = [plan["inputs"]["data"][0] for plan in model.stats()["plans"]]
    assert sorted(signatures) == [4, 8, 9]  # 1..8 rows padded into buckets; 9 runs exact


def test_a_busy_plan_hands_the_call_to_its_spare_when_runs_may_overlap() -> None:
    model = engine.load_model(*model_files("seed_mlp"))
    inputs, expected = model_io_sets("seed_mlp")[0]
    model.infer(inputs)
    plan = model.plan_for(inputs)
    model.concurrent_runs = 2
    with plan._lock:  # another thread is running this plan
        result = list(model.infer(inputs).values())[0]
    np.testing.assert_allclose(result, expected[0], rtol=1e-5, atol=1e-6)
    spare = model._plans.get(Signature.of(inputs)).spare
    assert spare is not None and spare is not plan


def test_three_runs_at_once_each_take_a_copy_of_the_plan() -> None:
    """With `concurrent_runs` 3 (a model served with three instances), a call finding the plan
    and its first spare both running takes the second spare, and gives the right rows."""
    model = engine.load_model(*model_files("seed_mlp"))
    inputs, expected = model_io_sets("seed_mlp")[0]
    model.infer(inputs)
    plan = model.plan_for(inputs)
    model.concurrent_runs = 3
    entry = model._plans.get(Signature.of(inputs))
    first = model._cache.replica(entry, 1)
    with plan._lock, first._lock:  # two other threads run the plan and its first spare
        result = list(model.infer(inputs).values())[0]
    np.testing.assert_allclose(result, expected[0], rtol=1e-5, atol=1e-6)
    assert len(entry.spares) == 2 and entry.spares[1] not in (plan, first)
    assert model._cache.free(entry) is plan  # nothing runs now: the plan itself


def test_warm_compiles_and_runs_every_spare() -> None:
    model = engine.load_model(*model_files("seed_mlp"))
    model.concurrent_runs = 3
    data = {"data": np.zeros((2, 512), np.float32)}
    model.warm(data, runs=1)
    entry = model._plans.get(Signature.of(data))
    assert len(entry.spares) == 2 and entry.spares[0] is not entry.spares[1]


def test_plan_shared_by_threads_gives_each_caller_its_rows() -> None:
    model = engine.load_model(*model_files("seed_mlp"))
    reference = engine.load_model(*model_files("seed_mlp"), optimize=False)
    rng = np.random.default_rng(2)
    batches = [rng.normal(size=(2, 512)).astype(np.float32) for _ in range(16)]
    results: dict[int, np.ndarray] = {}

    def call(index: int) -> None:
        for _ in range(5):
            results[index] = list(model.infer({"data": batches[index]}).values())[0]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index, batch in enumerate(batches):
        want = list(reference.infer({"data": batch}).values())[0]
        np.testing.assert_allclose(results[index], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flatten", [True, False])
@pytest.mark.parametrize("dtype, tolerance", [(np.float16, 1e-2), (np.float32, 1e-5),
                                              (np.float64, 1e-12)])
def test_bound_fully_connected_agrees_with_the_reference(flatten: bool, dtype: type,
                                                         tolerance: float) -> None:
    # float32 and float64 products go through np.dot, which writes only exact-dtype C-order
    # outputs; float16 falls back to np.matmul. Both must give the reference's numbers.
    net = sym.Activation(sym.FullyConnected(sym.var("data"), num_hidden=7, flatten=flatten),
                         act_type="relu")
    rng = np.random.default_rng(3)
    for shape in [(1, 3, 4), (5, 3, 4)]:
        args, _, _ = net.infer_shape(data=shape)
        params = {name: rng.normal(size=size).astype(dtype)
                  for name, size in zip(net.list_arguments(), args) if name != "data"}
        data = rng.normal(size=shape).astype(dtype)
        got = list(engine.load_model(net, params).infer({"data": data}).values())[0]
        want = list(engine.load_model(net, params, optimize=False).infer({"data": data})
                    .values())[0]
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


def test_warm_compiles_the_bucket_plan_and_its_spare() -> None:
    symbol, params = model_files("seed_mlp")
    model = engine.runtime.Model(engine.runtime.loader.read_graph(symbol),
                                 engine.runtime.loader.read_params(params), batch_buckets=(4,))
    model.concurrent_runs = 2
    model.warm({"data": np.zeros((3, 512), np.float32)}, runs=2)
    assert [plan["inputs"]["data"][0] for plan in model.stats()["plans"]] == [4]
    spare = model._plans.get(Signature.of({"data": np.zeros((4, 512), np.float32)})).spare
    assert spare is not None and spare is not model.plan_for({"data": np.zeros((4, 512),
                                                                              np.float32)})


def test_walk_times_every_step_of_a_run_made_as_run_makes_it() -> None:
    graph, _ = conv_bn_relu()
    plan = Plan(graph, {"data": (2, 2, 5, 5)}, {"data": np.dtype(np.float32)})
    feed = {"data": np.random.default_rng(1).normal(size=(2, 2, 5, 5)).astype(np.float32)}
    calls: list[bool] = []

    def probed(step: Step) -> Step:
        return Step(lambda: (calls.append(denormals.flushing_here()), step.call()), step.node)

    plan.steps[:] = [probed(step) for step in plan.steps]
    seconds = plan.walk(feed, time.perf_counter)
    assert len(seconds) == len(plan.steps) == len(calls) and all(t >= 0 for t in seconds)
    # Flushed as `run`'s steps are (a step called apart would not be).
    assert calls == [denormals.available()] * len(calls)
    assert not denormals.flushing_here()


def test_released_plans_are_forgotten_and_compiled_again_on_the_next_call() -> None:
    from tests.engine.runtime.helpers import load_pair

    data = sym.var("data")
    net = sym.Activation(sym.Convolution(data, kernel=(3, 3), pad=(1, 1), num_filter=32,
                                         name="conv"), act_type="relu")
    model, _ = load_pair(net, (2, 16, 24, 24), np.random.default_rng(5))
    feed = {"data": np.random.default_rng(6).normal(size=(2, 16, 24, 24)).astype(np.float32)}
    before = model.infer(feed)
    assert model.plan_signatures()
    model.release_plans()
    assert model.plan_signatures() == []
    assert model.derived_bytes == 0
    after = model.infer(feed)
    for name, value in before.items():
        np.testing.assert_allclose(after[name], value, rtol=1e-5, atol=1e-5)
    assert model.plan_signatures()
