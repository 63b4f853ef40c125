"""What a model tells of its inputs without ``__shape__``, its shape errors, and its caches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
from engine import sym
from engine.errors import InputError
from engine.runtime.lru import LRUCache
from tests.conformance.fixtures import model_files, model_io_sets, model_names

# Per fixture: the axes the graph cannot determine (besides the batch axis).
VARIABLE_AXES = {
    "concurrent_cnn": {"data": [2, 3]}, "hybridnet": {"data": []}, "legacy_json": {"data": []},
    "lenet": {"data": [2, 3]}, "multi_io": {"data0": [], "data1": [2, 3]},
    "np_mlp": {"data": [1]},  # a Reshape to (-1, 512) comes first: any multiple of 512 fits
    "resblock": {"data": [2, 3]}, "seed_mlp": {"data": []}, "text_lstm": {"data": [1]},
    "gluoncv_ssd_tiny": {"data": [2, 3]},
    # token ids and token types: any sequence length; valid_length: one number per row
    "gluonnlp_bert_tiny": {"data0": [1], "data1": [1], "data2": []},
    # the model families (tests/conformance/families.py) and MXNet's own 64-channel ResNet
    # blocks; images: any height and width, even where a Dense after Flatten fixes only their
    # product (ArcFace)
    **{name: {"data": [2, 3]} for name in (
        "arcface_tiny", "gluoncv_center_net_tiny", "gluoncv_deeplabv3_tiny",
        "gluoncv_fast_scnn_tiny", "gluoncv_fcn_tiny", "gluoncv_mobilenet_v3_tiny",
        "gluoncv_resnest_tiny", "gluoncv_resnet_v1b_tiny", "gluoncv_resnet_v1d_tiny",
        "gluoncv_se_resnext_tiny", "gluoncv_simple_pose_tiny", "gluoncv_yolo3_tiny",
        "mxnet_resnet_v1_wide")},
    "mxnet_rcnn_tiny": {"data0": [2, 3], "data1": []},  # images, (height, width, scale) each
    "gluonnlp_lstm_lm_tiny": {"data": [1]}, "gluonnlp_gru_lm_tiny": {"data": [1]},
    # source tokens, source lengths, target tokens, target lengths
    "gluonnlp_transformer_tiny": {"data0": [1], "data1": [], "data2": [1], "data3": []},
}
# Per fixture and output index: axes that follow a variable input axis (SSD's anchor count follows
# the image size, BERT's sequence axis the token count). Metadata says -1 there, and only there.
VARIABLE_OUTPUT_AXES = {"gluoncv_ssd_tiny": {0: [1], 1: [1], 2: [1]},
                        "gluonnlp_bert_tiny": {0: [1]},
                        "gluoncv_yolo3_tiny": {0: [1], 1: [1], 2: [1]},  # boxes per image size
                        "gluoncv_simple_pose_tiny": {0: [2, 3]},  # heatmaps follow the image
                        "gluonnlp_transformer_tiny": {0: [1]},  # logits per target token
                        "gluonnlp_lstm_lm_tiny": {0: [1]}, "gluonnlp_gru_lm_tiny": {0: [1]}}
RNG = np.random.default_rng(5)


def output_metadata(name: str, index: int, reference: tuple[int, ...]) -> tuple[int, ...]:
    """The metadata shape output `index` of fixture `name` should have, given MXNet's shape."""
    variable = VARIABLE_OUTPUT_AXES.get(name, {}).get(index, [])
    return tuple(-1 if axis == 0 or axis in variable else dim
                 for axis, dim in enumerate(reference))


def test_every_fixture_is_listed() -> None:
    assert sorted(VARIABLE_AXES) == model_names()


@pytest.mark.parametrize("name", model_names())
def test_fixture_inputs_get_rank_and_every_dimension_the_graph_fixes(name: str) -> None:
    model = engine.load_model(*model_files(name))
    inputs, expected = model_io_sets(name)[0]
    for spec in model.inputs:
        given = inputs[spec.name].shape
        assert spec.shape is not None and len(spec.shape) == len(given), (spec, given)
        want = [-1 if axis == 0 or axis in VARIABLE_AXES[name][spec.name] else dim
                for axis, dim in enumerate(given)]
        assert list(spec.shape) == want, (name, spec)
    for index, (spec, reference) in enumerate(zip(model.outputs, expected)):
        assert spec.shape == output_metadata(name, index, reference.shape), (name, spec)
    assert model.output_shapes({key: array.shape for key, array in inputs.items()}) == {
        spec.name: reference.shape for spec, reference in zip(model.outputs, expected)}


def _model(symbol: Any, data_shape: tuple[int, ...], **kwargs: Any) -> engine.Model:
    args, _, _ = symbol.infer_shape(data=data_shape)
    params = {name: RNG.normal(size=shape).astype(np.float32)
              for name, shape in zip(symbol.list_arguments(), args) if name != "data"}
    return engine.load_model(symbol, params, **kwargs)


def conv_net() -> Any:
    """Convolution, global pooling, FullyConnected: channels fixed, height and width free."""
    data = sym.var("data")
    conv = sym.Convolution(data, kernel=(3, 3), pad=(1, 1), num_filter=4, name="conv")
    pool = sym.Pooling(sym.Activation(conv, act_type="relu"), global_pool=True,
                       pool_type="avg", kernel=(1, 1), name="pool")
    return sym.FullyConnected(pool, num_hidden=2, name="fc")


def test_synthetic_conv_graph_fixes_channels_and_leaves_height_and_width() -> None:
    model = _model(conv_net(), (1, 5, 8, 8))
    assert [spec.shape for spec in model.inputs] == [(-1, 5, -1, -1)]
    assert [spec.shape for spec in model.outputs] == [(-1, 2)]
    for shape in [(1, 5, 3, 9), (2, 5, 17, 4)]:
        data = RNG.normal(size=shape).astype(np.float32)
        assert model.infer({"data": data})["fc_output"].shape == (shape[0], 2)


def test_fully_connected_without_flatten_fixes_the_feature_axis() -> None:
    symbol = sym.FullyConnected(sym.var("data"), num_hidden=3, flatten=False, name="fc")
    model = _model(symbol, (2, 7))
    assert [spec.shape for spec in model.inputs] == [(-1, 7)]
    assert [spec.shape for spec in model.outputs] == [(-1, 3)]


def test_flattening_fully_connected_fills_its_one_unknown_axis() -> None:
    symbol = sym.FullyConnected(sym.var("data"), num_hidden=3, name="fc")
    model = _model(symbol, (2, 12))
    assert [spec.shape for spec in model.inputs] == [(-1, 12)]  # rank 1 would flatten to 1
    assert model.output_shapes({"data": (4, 2, 6)}) == {"fc_output": (4, 3)}


def test_misfit_names_the_input_the_node_its_op_and_the_shapes() -> None:
    model = _model(conv_net(), (1, 5, 8, 8))
    with pytest.raises(InputError) as caught:
        model.infer({"data": np.zeros((1, 6, 8, 8), np.float32)})
    message = str(caught.value)
    for part in ("input 'data' shape [1, 6, 8, 8]", "node 'conv' (Convolution)",
                 "its inputs there: data (1, 6, 8, 8), weight (4, 5, 3, 3)"):
        assert part in message, message
    with pytest.raises(InputError, match=r"input 'data' shape \[1, 5, 8\]"):
        model.output_shapes({"data": (1, 5, 8)})


def test_keep_batch_refuses_shapes_that_change_the_number_of_rows() -> None:
    folding = engine.load_model(*model_files("np_mlp"), keep_batch=True)
    with pytest.raises(InputError, match=r"2 rows for 1; outputs must keep"):
        folding.infer({"data": np.zeros((1, 1024), np.float32)})
    assert folding.infer({"data": np.zeros((3, 512), np.float32)})["np_mlp_add0_output"].shape == (
        3, 2)
    plain = engine.load_model(*model_files("np_mlp"))  # the engine alone allows it
    assert plain.infer({"data": np.zeros((1, 1024), np.float32)})["np_mlp_add0_output"].shape == (
        2, 2)


def test_multi_input_misfit_names_only_the_input_behind_the_node() -> None:
    model = engine.load_model(*model_files("multi_io"))
    inputs = {"data0": np.zeros((1, 5), np.float32), "data1": np.zeros((1, 3, 6, 7), np.float32)}
    with pytest.raises(InputError) as caught:
        model.infer(inputs)
    assert str(caught.value).startswith("input 'data1' shape [1, 3, 6, 7] does not fit")
    assert "'data0'" not in str(caught.value)


def test_plan_and_shape_caches_stay_within_their_bound() -> None:
    model = _model(conv_net(), (1, 5, 8, 8), plan_cache_size=3)
    hot = np.zeros((1, 5, 4, 4), np.float32)
    model.infer({"data": hot})
    hot_plan = model.plan_for({"data": hot})
    for side in range(5, 15):
        model.infer({"data": np.zeros((1, 5, side, side), np.float32)})
        model.infer({"data": hot})  # used between every new shape: never the least recent
        stats = model.cache_stats()
        assert all(cache["entries"] <= 3 for cache in stats.values()), stats
    assert model.plan_for({"data": hot}) is hot_plan
    stats = model.cache_stats()
    assert stats["plans"] == {"entries": 3, "capacity": 3, "evictions": 8}
    assert stats["shapes"]["evictions"] == 8
    assert len(model.stats()["plans"]) == 3 == len(model.plan_signatures())
    # The hot shape and the two newest stay; every other shape was evicted with its plan.
    kept = sorted(dict(signature)["data"][2] for signature in model.plan_signatures())
    assert kept == [4, 13, 14]


def test_lru_cache_evicts_least_recently_used_and_reports_it() -> None:
    evicted: list[tuple[str, int]] = []
    cache: LRUCache[str, int] = LRUCache(2, on_evict=lambda key, value: evicted.append(
        (key, value)))
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert evicted == [("b", 2)] and cache.keys() == ["a", "c"] and cache.evictions == 1
    assert cache.touch("a") and not cache.touch("b")
    cache.put("d", 4)
    assert cache.keys() == ["a", "d"] and "c" not in cache and len(cache) == 2
    assert cache.get("missing") is None
    with pytest.raises(ValueError, match="at least 1"):
        LRUCache(0)


def test_lru_pop_removes_an_entry_without_counting_an_eviction() -> None:
    evicted: list[tuple[str, int]] = []
    cache: LRUCache[str, int] = LRUCache(2, on_evict=lambda key, value: evicted.append(
        (key, value)))
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.pop("a") == 1
    assert cache.pop("a") is None
    assert cache.keys() == ["b"]
    assert (cache.evictions, evicted) == (0, [])
