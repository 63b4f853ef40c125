"""`Signature`, the one key of a model's caches, and the options that shape which keys exist."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.runtime.signature import Signature
from tests.conformance.fixtures import model_files, model_io_sets


def test_signatures_built_three_ways_are_one_key() -> None:
    feed = {"data": np.zeros((2, 3), np.float32), "mask": np.ones((2,), np.int32)}
    from_feed = Signature.of(feed)
    from_plain = Signature.lookup_key(feed)
    from_specs = Signature.from_specs({"data": [2, 3], "mask": (np.int64(2),)},
                                      {"data": "float32", "mask": np.int32})
    assert from_feed == from_plain == from_specs
    assert len({from_feed, from_plain, from_specs}) == 1
    assert from_feed.names() == ["data", "mask"]
    assert from_feed.shapes() == {"data": (2, 3), "mask": (2,)}
    assert from_feed.dtypes() == {"data": np.dtype(np.float32), "mask": np.dtype(np.int32)}
    # The order of the inputs is part of the key; a different dtype or shape is another key.
    assert Signature.of(dict(reversed(feed.items()))) != from_feed
    assert Signature.of({**feed, "mask": np.ones((2,), np.int64)}) != from_feed
    assert Signature.of({**feed, "data": np.zeros((2, 4), np.float32)}) != from_feed


def test_only_plain_arrays_give_a_lookup_key() -> None:
    assert Signature.lookup_key({"data": [[1.0, 2.0]]}) is None
    subclass = np.zeros((1, 2)).view(type("Subclass", (np.ndarray,), {}))
    assert Signature.lookup_key({"data": subclass}) is None
    assert Signature.lookup_key({"a": np.zeros(2), "b": [1.0]}) is None
    assert Signature.lookup_key({}) == Signature.of({})
    feed = {"data": np.zeros((2, 3), np.float32)}
    cache = {Signature.of(feed): "plan"}
    assert cache.get(Signature.lookup_key(feed)) == "plan"  # found by the plain tuple


def test_with_rows_sets_the_batch_of_every_input_but_scalars() -> None:
    signature = Signature.of({"data": np.zeros((3, 5), np.float16),
                              "scale": np.float32(2.0) * np.ones((), np.float32)})
    assert signature.rows() is None  # the scalar has no batch axis
    padded = signature.with_rows(8)
    assert padded.shapes() == {"data": (8, 5), "scale": ()}
    assert padded.dtypes() == signature.dtypes()
    batch = Signature.of({"a": np.zeros((3, 5)), "b": np.zeros((3,))})
    assert batch.rows() == 3 and batch.with_rows(4).rows() == 4
    assert Signature.of({"a": np.zeros((3, 5)), "b": np.zeros((2,))}).rows() is None
    assert repr(padded) == "Signature(data: [8, 5] float16, scale: [] float32)"


def test_batch_buckets_from_load_model_pad_batches_to_few_plans() -> None:
    symbol, params = model_files("seed_mlp")
    model = engine.load_model(symbol, params, batch_buckets=[8, 2])
    assert model.batch_buckets == (2, 8)
    inputs, expected = model_io_sets("seed_mlp")[0]
    for rows in (1, 2, 5):
        data = np.repeat(inputs["data"], rows, axis=0)
        got = model.run({"data": data})[0]
        np.testing.assert_allclose(got, np.repeat(expected[0], rows, axis=0),
                                   rtol=1e-4, atol=1e-5)
    assert sorted(dict(key)["data"][0] for key in model.plan_signatures()) == [2, 8]
    assert engine.load_model(symbol, params).batch_buckets is None


@pytest.mark.parametrize("buckets, wrong", [((0, 4), "0"), ((2, -1), "-1"), ((2.5,), "2.5"),
                                            ((True,), "True"), (("4",), "'4'")])
def test_batch_buckets_other_than_positive_integers_are_refused(buckets: tuple,
                                                                wrong: str) -> None:
    with pytest.raises(ValueError, match=rf"batch_buckets must be positive integers; got "
                                         rf"{wrong} in \["):
        engine.load_model(*model_files("seed_mlp"), batch_buckets=buckets)


def test_buckets_set_later_take_over_signatures_already_checked() -> None:
    model = engine.load_model(*model_files("seed_mlp"))
    data = np.ones((3, 512), np.float32)
    first = model.run({"data": data})[0]
    model.run({"data": data})  # the fast path for 3 rows now
    model.batch_buckets = (4,)
    again = model.run({"data": data})[0]
    np.testing.assert_allclose(again, first, rtol=1e-5, atol=1e-6)
    assert [dict(key)["data"][0] for key in model.plan_signatures()] == [3, 4]
    assert model.stats()["plans"][-1]["inputs"] == {"data": [4, 512]}  # the one used last


def test_run_gives_infers_outputs_in_head_order() -> None:
    model = engine.load_model(*model_files("multi_io"))
    inputs, expected = model_io_sets("multi_io")[0]
    for _ in range(2):  # checked, then the fast path
        outputs = model.run(inputs)
        assert len(outputs) == len(model.output_names) == len(expected)
        for got, want in zip(outputs, expected):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    named = model.infer({name: value.tolist() for name, value in inputs.items()})
    assert list(named) == model.output_names
    for got, want in zip(named.values(), model.run(inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
