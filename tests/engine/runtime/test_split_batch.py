"""A CPU batch cut into runs of rows on several cores (`engine.runtime.batch_split`) gives the
results of the whole batch, in row order, only where rows are independent."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import engine
from engine import sym
from engine.cpu import blas_threads, parallel, thread_share
from engine.runtime import batch_split

RNG = np.random.default_rng(21)


@pytest.fixture(autouse=True)
def blas(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Three cores and three BLAS threads whatever the machine, no minimum work; BLAS's count
    and the default setting put back after. Yields numpy's OpenBLAS thread control."""
    blas = blas_threads.numpy_openblas()
    assert blas is not None and batch_split.blas_controllable(), \
        "numpy's OpenBLAS thread count must be settable"
    monkeypatch.setattr(parallel, "cores", lambda: 3)
    monkeypatch.setattr(batch_split, "MIN_PART_WORK", 0)
    before = blas.count()
    blas.set(3)
    yield blas
    blas.set(before)
    batch_split.set_threads(None)


@pytest.fixture
def split_sizes(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The row counts of the runs of each split call (one list per call)."""
    calls: list[list[int]] = []
    run_parts = batch_split.run_parts

    def spy(parts: list) -> list:
        results = run_parts(parts)
        calls.append([part.args[1].rows() for part in parts])
        return results

    monkeypatch.setattr(batch_split, "run_parts", spy)
    return calls


def seed_mlp() -> Any:
    net = sym.var("data")
    for index, width in enumerate((16, 8)):
        net = sym.relu(sym.FullyConnected(net, num_hidden=width, name=f"fc{index}"))
    return sym.FullyConnected(net, num_hidden=2, name="out")


def small_cnn() -> Any:
    net = sym.Convolution(sym.var("data"), num_filter=4, kernel=(3, 3), pad=(1, 1), name="c1")
    net = sym.relu(sym.BatchNorm(net, fix_gamma=False, name="bn1"))
    net = sym.Pooling(net, kernel=(2, 2), stride=(2, 2), pool_type="max")
    net = sym.Convolution(net, num_filter=6, kernel=(3, 3), num_group=2, name="c2")
    net = sym.Pooling(sym.relu(net), kernel=(1, 1), global_pool=True, pool_type="avg")
    return sym.softmax(sym.FullyConnected(sym.Flatten(net), num_hidden=3, name="fc"))


NETS = {"mlp": (seed_mlp, (6,)), "cnn": (small_cnn, (3, 8, 8))}


def load(symbol: Any, data_shape: tuple[int, ...], **options: Any) -> engine.Model:
    args, _, aux = symbol.infer_shape(data=data_shape)
    params = {name: RNG.normal(size=shape).astype(np.float32)
              for name, shape in zip(symbol.list_arguments(), args) if name != "data"}
    params.update({name: RNG.uniform(0.5, 1.5, shape).astype(np.float32)
                   for name, shape in zip(symbol.list_auxiliary_states(), aux)})
    return engine.load_model(symbol, params, **options)


def whole(model: engine.Model, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs with splitting off."""
    batch_split.set_threads(1)
    try:
        return model.infer(feed)
    finally:
        batch_split.set_threads(None)


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name in want:
        assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("net", list(NETS))
@pytest.mark.parametrize(("rows", "sizes"), [(2, [1, 1]), (3, [1, 1, 1]), (5, [1, 2, 2]),
                                             (7, [2, 2, 3])])
def test_split_matches_the_whole_batch(net: str, rows: int, sizes: list[int],
                                       split_sizes: list[list[int]]) -> None:
    build, shape = NETS[net]
    model = load(build(), (1, *shape))
    feed = {"data": RNG.normal(size=(rows, *shape)).astype(np.float32)}
    want = whole(model, feed)
    assert_same(model.infer(feed), want)
    assert_same(model.infer(feed), want)  # again, through the cached plans
    assert split_sizes == [sizes, sizes]


def test_rows_come_back_in_order(split_sizes: list[list[int]]) -> None:
    model = load(small_cnn(), (1, 3, 8, 8))
    feed = {"data": RNG.normal(size=(5, 3, 8, 8)).astype(np.float32)}
    got = model.infer(feed)
    assert split_sizes == [[1, 2, 2]]
    for row in range(5):
        alone = model.infer({"data": feed["data"][row:row + 1]})
        for name, value in alone.items():
            np.testing.assert_allclose(got[name][row:row + 1], value, rtol=1e-5, atol=1e-6)


def test_one_row_is_never_split(split_sizes: list[list[int]]) -> None:
    model = load(seed_mlp(), (1, 6))
    feed = {"data": RNG.normal(size=(1, 6)).astype(np.float32)}
    assert_same(model.infer(feed), whole(model, feed))
    assert split_sizes == []


def test_the_setting_is_honoured(blas: Any, split_sizes: list[list[int]]) -> None:
    model = load(seed_mlp(), (1, 6))
    feed = {"data": RNG.normal(size=(6, 6)).astype(np.float32)}
    batch_split.set_threads(1)
    model.infer(feed)
    model.infer(feed)  # its checks now skipped: the setting must still be read
    batch_split.set_threads(2)
    model.infer(feed)
    batch_split.set_threads(None)  # as many as BLAS's threads: three here
    model.infer(feed)
    batch_split.set_threads(8)  # never more runs than cores
    model.infer(feed)
    assert split_sizes == [[3, 3], [2, 2, 2], [2, 2, 2]]
    assert batch_split.threads() == 8


def test_by_default_blas_on_one_thread_means_no_split(blas: Any,
                                                      split_sizes: list[list[int]]) -> None:
    model = load(seed_mlp(), (1, 6))
    feed = {"data": RNG.normal(size=(6, 6)).astype(np.float32)}
    blas.set(1)  # as OPENBLAS_NUM_THREADS=1 or threadpoolctl's limit would
    model.infer(feed)
    model.infer(feed)  # its checks now skipped, but only while BLAS keeps to one thread
    assert [entry.checked for _, entry in model._plans.items()] == [True]
    assert batch_split.threads() == 1
    blas.set(2)
    model.infer(feed)
    assert split_sizes == [[3, 3]]


def test_an_instance_splits_over_its_share_into_plan_copies_of_its_own(
        blas: Any, split_sizes: list[list[int]]) -> None:
    """A served instance's batch (BLAS held to one thread, its share of two cores set for its
    thread) splits into two runs, even after the same batch ran whole with BLAS on one thread
    and no share; instance 1's runs take plan copies 2 and 3, never instance 0's 0 and 1."""
    model = load(seed_mlp(), (1, 6))
    feed = {"data": RNG.normal(size=(6, 6)).astype(np.float32)}
    blas.set(1)
    model.infer(feed)
    model.infer(feed)  # checked: skipped while BLAS keeps to one thread and nothing is shared
    with thread_share.sharing(2, 1):
        got = model.infer(feed)
    assert split_sizes == [[3, 3]]
    assert_same(got, whole(model, feed))
    entry = model._plans.get(engine.runtime.signature.Signature.of({"data": feed["data"][:3]}))
    assert len(entry.spares) == 3  # copies 1 and 2 made to reach copy 3
    assert not entry.plan.busy and all(not plan.busy for plan in entry.spares)


@pytest.mark.parametrize("count", [0, -1, True, 1.5])
def test_bad_settings_are_refused(count: Any) -> None:
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        batch_split.set_threads(count)


def test_too_little_work_runs_whole(monkeypatch: pytest.MonkeyPatch,
                                    split_sizes: list[list[int]]) -> None:
    model = load(small_cnn(), (1, 3, 8, 8))
    feed = {"data": RNG.normal(size=(4, 3, 8, 8)).astype(np.float32)}
    per_row = batch_split.work(model.graph, model._splitter.batch_nodes,
                               model._checker.signature_shapes(
                                   engine.runtime.signature.Signature.of(
                                       {"data": feed["data"][:1]})))
    monkeypatch.setattr(batch_split, "MIN_PART_WORK", 2 * per_row)  # two runs of two rows
    model.infer(feed)
    monkeypatch.setattr(batch_split, "MIN_PART_WORK", 5 * per_row)
    model.infer({"data": feed["data"][:3]})
    assert split_sizes == [[2, 2]]


def test_dense_layers_do_not_count_as_work() -> None:
    model = load(seed_mlp(), (1, 6))
    shapes = model._checker.signature_shapes(engine.runtime.signature.Signature.of(
        {"data": np.zeros((4, 6), np.float32)}))
    # Each computed value carrying the batch counts its elements once (BLAS threads the dense
    # GEMMs already): fc0 and its relu, fc1 and its relu, out.
    assert batch_split.work(model.graph, model._splitter.batch_nodes,
                            shapes) == 4 * (16 * 2 + 8 * 2 + 2)


def test_concurrent_callers_get_their_own_rows() -> None:
    model = load(small_cnn(), (1, 3, 8, 8))
    feeds = [{"data": RNG.normal(size=(rows, 3, 8, 8)).astype(np.float32)}
             for rows in (4, 4, 5, 1, 2)]
    want = [whole(model, feed) for feed in feeds]
    errors: list[BaseException] = []

    def caller(index: int) -> None:
        try:
            for _ in range(5):
                assert_same(model.infer(feeds[index]), want[index])
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    callers = [threading.Thread(target=caller, args=(index,)) for index in range(len(feeds))]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join()
    assert errors == []


def test_blas_runs_one_thread_per_part_and_is_restored(blas: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    model = load(seed_mlp(), (1, 6))
    seen: list[int] = []
    run_part = model._splitter._run_part

    def spy(*args: Any) -> list:
        seen.append(blas.count())
        return run_part(*args)

    monkeypatch.setattr(model._splitter, "_run_part", spy)
    model.infer({"data": RNG.normal(size=(6, 6)).astype(np.float32)})
    assert seen == [1, 1, 1]
    assert blas.count() == 3


def test_a_failing_run_raises_after_every_run_ended() -> None:
    ended: list[int] = []

    def fail() -> None:
        raise RuntimeError("run 0 failed")

    def slow(index: int) -> int:
        threading.Event().wait(0.05)
        ended.append(index)
        return index

    with pytest.raises(RuntimeError, match="run 0 failed"):
        batch_split.run_parts([fail, lambda: slow(1), lambda: slow(2)])
    assert sorted(ended) == [1, 2]


def test_data_dependent_shapes_never_split(split_sizes: list[list[int]]) -> None:
    hidden = sym.relu(sym.FullyConnected(sym.var("x"), num_hidden=4, name="fc"))
    kept = sym._contrib_boolean_mask(hidden, sym.var("m"), name="mask")
    model = engine.load_model(kept, {"fc_weight": RNG.normal(size=(4, 3)).astype(np.float32),
                                     "fc_bias": np.zeros(4, np.float32)})
    feed = {"x": RNG.normal(size=(6, 3)).astype(np.float32),
            "m": np.array([1, 0, 1, 1, 0, 1], np.float32)}
    assert model.infer(feed)[model.output_names[0]].shape == (4, 4)
    assert model.split_blocker is not None and "mask" in model.split_blocker
    assert split_sizes == []


@pytest.mark.parametrize("head", ["sum", "softmax", "reshape", "concat"])
def test_rows_that_mix_never_split(head: str, split_sizes: list[list[int]]) -> None:
    hidden = sym.FullyConnected(sym.var("data"), num_hidden=4, name="fc")
    net = {"sum": lambda: sym.broadcast_sub(hidden, sym.mean(hidden, axis=0, keepdims=True)),
           "softmax": lambda: sym.softmax(hidden, axis=0),
           "reshape": lambda: sym.Reshape(hidden, shape=(-1, 2)),
           "concat": lambda: sym.Concat(hidden, hidden, dim=0)}[head]()
    model = load(net, (1, 5))
    feed = {"data": RNG.normal(size=(6, 5)).astype(np.float32)}
    assert_same(model.infer(feed), whole(model, feed))
    assert split_sizes == []


def test_an_output_without_rows_never_splits(split_sizes: list[list[int]]) -> None:
    hidden = sym.FullyConnected(sym.var("data"), num_hidden=3, name="fc")
    net = sym.Group([hidden, sym.sum(sym.var("fc_weight"), axis=1, name="weight_sums")])
    model = engine.load_model(net, {"fc_weight": RNG.normal(size=(3, 5)).astype(np.float32),
                                    "fc_bias": np.zeros(3, np.float32)})
    feed = {"data": RNG.normal(size=(6, 5)).astype(np.float32)}
    got = model.infer(feed)
    assert got["weight_sums_output"].shape == (3,)
    assert_same(got, whole(model, feed))
    assert split_sizes == []


def test_inputs_without_a_common_batch_never_split(split_sizes: list[list[int]]) -> None:
    net = sym.broadcast_add(sym.FullyConnected(sym.var("data"), num_hidden=3, name="fc"),
                            sym.var("offset"))
    model = engine.load_model(net, {"fc_weight": RNG.normal(size=(3, 5)).astype(np.float32),
                                    "fc_bias": np.zeros(3, np.float32)})
    for offset in (np.ones((1, 3), np.float32), np.float32(2.0) * np.ones(3, np.float32)):
        feed = {"data": RNG.normal(size=(6, 5)).astype(np.float32), "offset": offset}
        assert_same(model.infer(feed), whole(model, feed))
    assert split_sizes == []


def test_the_interpreter_never_splits(split_sizes: list[list[int]]) -> None:
    model = load(seed_mlp(), (1, 6), optimize=False)
    model.infer({"data": RNG.normal(size=(6, 6)).astype(np.float32)})
    assert model.split_blocker == "it runs the reference interpreter (optimize=False)"
    assert split_sizes == []


def test_batch_buckets_pad_each_run(split_sizes: list[list[int]]) -> None:
    model = load(seed_mlp(), (1, 6), batch_buckets=[4, 8])
    feed = {"data": RNG.normal(size=(7, 6)).astype(np.float32)}
    assert_same(model.infer(feed), whole(model, feed))
    assert split_sizes == [[2, 2, 3]]
    assert {shape[0] for ((_, shape),) in model.plan_signatures()} == {4, 8}
    # All three runs pad to 4 rows: each ran its own copy of that plan.
    entry = model._plans.get(engine.runtime.signature.Signature.of({"data": feed["data"][:4]}))
    assert len(entry.spares) == 2


@pytest.mark.parametrize("op, attrs", [
    ("_slice_assign_scalar", {"scalar": -1.0, "begin": (1,), "end": (3,)}),
    ("_slice_assign_scalar", {"scalar": -1.0, "begin": (None,), "end": (None,), "step": (-2,)}),
    ("_npi_boolean_mask_assign_scalar", {"value": -1.0}),
])
def test_assignment_at_fixed_rows_never_splits(op: str, attrs: dict,
                                               split_sizes: list[list[int]]) -> None:
    # A run of rows would write its own rows 1 and 2; a mask over axis 0 keeps the batch
    # whole too (the tensor form's k-th value row counts true elements over all rows).
    hidden = sym.FullyConnected(sym.var("data"), num_hidden=4, name="fc")
    inputs = [hidden]
    if op.startswith("_npi_boolean_mask"):
        inputs.append(sym.var("mask"))
    model = engine.load_model(getattr(sym, op)(*inputs, **attrs, name="assign"),
                              {"fc_weight": RNG.normal(size=(4, 5)).astype(np.float32),
                               "fc_bias": np.zeros(4, np.float32)})
    feed = {"data": RNG.normal(size=(6, 5)).astype(np.float32)}
    if "mask" in model.input_names:
        feed["mask"] = np.array([0, 1, 1, 0, 0, 1], np.float32)
    got = model.infer(feed)
    assert_same(got, whole(model, feed))
    assert (got["assign_output"] == -1).all(axis=1).sum() in (2, 3)
    assert model.split_blocker is not None and "axis 0" in model.split_blocker
    assert split_sizes == []


def test_assignment_that_leaves_the_batch_axis_whole_still_splits(
        split_sizes: list[list[int]]) -> None:
    hidden = sym.FullyConnected(sym.var("data"), num_hidden=4, name="fc")
    net = sym._slice_assign_scalar(hidden, scalar=-1.0, begin=(None, 1), end=(None, 3))
    model = load(net, (1, 5))
    feed = {"data": RNG.normal(size=(6, 5)).astype(np.float32)}
    assert_same(model.infer(feed), whole(model, feed))
    assert split_sizes == [[2, 2, 2]]


def test_rows_copied_to_fixed_positions_never_split(split_sizes: list[list[int]]) -> None:
    net = sym._contrib_index_copy(sym.var("data"), sym.var("index"), sym.var("rows"),
                                  name="copy")
    model = engine.load_model(net, {"index": np.array([1, 3], np.float32),
                                    "rows": np.full((2, 5), -1, np.float32)})
    feed = {"data": RNG.normal(size=(6, 5)).astype(np.float32)}
    got = model.infer(feed)["copy_output"]
    assert np.flatnonzero((got == -1).all(axis=1)).tolist() == [1, 3]
    assert model.split_blocker is not None and "axis 0" in model.split_blocker
    assert split_sizes == []
