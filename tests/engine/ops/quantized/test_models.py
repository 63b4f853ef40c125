"""MXNet 1.9.1's int8 exports served as exported: `engine.load_model` on the files
``quantize_net`` wrote, against MXNet's own int8 outputs on the same inputs.

The bound is one quantisation step of the output, taken as max|MXNet output| / 127.5 (MXNet's
int8 range); the engine is in fact bit-exact on these fixtures, which the second check pins.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import engine
from engine.errors import ModelFormatError, ShapeError
from engine.ops import get_op
from tests.engine.ops.quantized import fixtures


@pytest.fixture(scope="module", params=fixtures.MODELS)
def name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.mark.parametrize("optimize", [True, False], ids=["compiled", "interpreter"])
def test_model_matches_mxnet_int8(name: str, optimize: bool) -> None:
    symbol, params = fixtures.paths(name)
    model = engine.load_model(str(symbol), str(params), optimize=optimize)
    data = fixtures.io(name)["data"]
    expected = fixtures.io(name)["int8_output"]
    (result,) = model.infer({"data": data}).values()
    result = np.asarray(result)
    assert result.shape == expected.shape
    step = np.abs(expected).max() / 127.5
    assert np.abs(result - expected).max() <= step
    assert np.mean(result == expected) >= 0.99  # equal, short of a rare float32 tie


def test_top1_follows_mxnet_int8(name: str) -> None:
    """The engine's classes are MXNet's int8 classes (how often those agree with the float
    model's is MXNet's own figure, in meta.json)."""
    symbol, params = fixtures.paths(name)
    model = engine.load_model(str(symbol), str(params))
    (result,) = model.infer({"data": fixtures.io(name)["data"]}).values()
    np.testing.assert_array_equal(np.asarray(result).argmax(-1),
                                  fixtures.io(name)["int8_output"].argmax(-1))


def test_the_names_mxnet_refused_before_now_load() -> None:
    for op in ("_contrib_quantize_v2", "_contrib_dequantize", "_contrib_requantize",
               "_sg_mkldnn_conv", "_sg_mkldnn_fully_connected", "_sg_mkldnn_selfatt_qk",
               "_sg_mkldnn_selfatt_valatt", "_contrib_quantized_concat"):
        assert get_op(op).name == op


def test_float_data_into_a_quantized_layer_is_refused_by_name() -> None:
    op = get_op("_contrib_quantized_pooling")
    attrs = op.parse_attrs({"kernel": "(2, 2)", "pool_type": "max", "stride": "(2, 2)"})
    data = np.zeros((1, 1, 4, 4), dtype=np.float32)
    with pytest.raises(ShapeError, match="_contrib_quantized_pooling: input 'data' has dtype "
                                         "float32"):
        op.compute(np, attrs, [data, np.zeros(1, np.float32), np.ones(1, np.float32)])


def test_quantize_v2_rounds_with_mxnets_range() -> None:
    """127.5 steps per max(|min|, |max|), half to even, saturating: 1.0 over [-1, 1] is 127
    (127.5 rounds to 128, then saturates), 0.5 is 64 (63.75), -1.0 is -128."""
    op = get_op("_contrib_quantize_v2")
    attrs = op.parse_attrs({"min_calib_range": "-1", "max_calib_range": "1", "out_type": "int8"})
    data = np.array([1.0, 0.5, -1.0, 0.2], dtype=np.float32)
    quantized, low, high = op.compute(np, attrs, [data])
    np.testing.assert_array_equal(quantized, np.array([127, 64, -128, 26], dtype=np.int8))
    assert (float(low[0]), float(high[0])) == (-1.0, 1.0)


def test_requantize_maps_int32_onto_the_calibrated_range() -> None:
    """An int32 value v over [-r, r] stands for v * r / 2**31; requantized onto [-2, 2] it
    becomes round(real * 127 / 2), half to even (requantize counts 127, not 127.5)."""
    op = get_op("_contrib_requantize")
    attrs = op.parse_attrs({"min_calib_range": "-2", "max_calib_range": "2"})
    reach = np.float32(2 ** 31) / np.float32(1 << 20)  # one real unit per 2**20 steps
    data = np.array([1 << 20, -(1 << 19), 3 << 20], dtype=np.int32)
    quantized, low, high = op.compute(np, attrs, [data, np.array([-reach], np.float32),
                                                  np.array([reach], np.float32)])
    np.testing.assert_array_equal(quantized, np.array([64, -32, 127], dtype=np.int8))
    assert (float(low[0]), float(high[0])) == (-2.0, 2.0)


def test_a_fused_node_without_its_subgraph_is_refused_by_name() -> None:
    document = json.loads(fixtures.paths("resnet18_v1_naive")[0].read_text())
    node = next(node for node in document["nodes"] if node["op"] == "_sg_mkldnn_conv")
    del node["subgraphs"]
    with pytest.raises(ModelFormatError, match=rf"{node['name']}.*_sg_mkldnn_conv.*has 0 "
                                               r"subgraphs; this op takes 1"):
        engine.load_model(json.dumps(document), str(fixtures.paths("resnet18_v1_naive")[1]))


class DeviceArray:
    """Stands for a GPU array: its contents reach the host only through ``get``."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        self.shape, self.dtype = values.shape, values.dtype

    def get(self) -> np.ndarray:
        return self.values

    def __array__(self, *args: object, **kwargs: object) -> np.ndarray:
        raise TypeError("implicit conversion of a device array")


class DeviceModule:
    """Stands for CuPy: ``asarray`` puts a host array on the device."""

    @staticmethod
    def asarray(values: np.ndarray) -> DeviceArray:
        return DeviceArray(np.asarray(values))


def test_a_device_plan_runs_the_int8_ops_through_host_copies() -> None:
    op = get_op("_contrib_quantize_v2")
    attrs = op.parse_attrs({"min_calib_range": "-1", "max_calib_range": "1", "out_type": "int8"})
    data = np.array([1.0, 0.5, -1.0, 0.2], dtype=np.float32)
    on_device = op.kernel(DeviceModule, attrs, DeviceArray(data))
    on_host = op.kernel(np, attrs, data)
    assert all(isinstance(value, DeviceArray) for value in on_device)
    for device_value, host_value in zip(on_device, on_host, strict=True):
        np.testing.assert_array_equal(device_value.get(), host_value)
    assert not op.capturable


def test_the_imperative_front_end_offers_the_int8_ops() -> None:
    import engine.nd as nd

    data = nd.array(np.array([1.0, 0.5, -1.0], dtype=np.float32))
    quantized, low, high = nd._contrib_quantize_v2(data, min_calib_range=-1.0,
                                                   max_calib_range=1.0, out_type="int8")
    np.testing.assert_array_equal(quantized.asnumpy(), np.array([127, 64, -128], np.int8))
    restored = nd._contrib_dequantize(quantized, low, high).asnumpy()
    np.testing.assert_allclose(restored, [127 / 127.5, 64 / 127.5, -128 / 127.5], rtol=1e-6)


def _renamed(document: dict, old: str, new: str) -> dict:
    for node in document["nodes"]:
        if old in node.get("attrs", {}):
            node["attrs"][new] = node["attrs"].pop(old)
    return document


def test_mxnet_1_5_flag_names_load_as_the_same_model() -> None:
    symbol, params = fixtures.paths("resnet18_v1_naive")
    document = json.loads(symbol.read_text())
    document = _renamed(_renamed(document, "with_act", "with_relu"), "with_postsum_act",
                        "with_postsum_relu")
    model = engine.load_model(json.dumps(document), str(params))
    (result,) = model.infer({"data": fixtures.io("resnet18_v1_naive")["data"]}).values()
    np.testing.assert_array_equal(np.asarray(result),
                                  fixtures.io("resnet18_v1_naive")["int8_output"])


def test_a_flag_that_changes_the_arithmetic_is_refused_by_name() -> None:
    symbol, params = fixtures.paths("resnet18_v1_naive")
    document = json.loads(symbol.read_text())
    node = next(node for node in document["nodes"] if node["op"] == "_sg_mkldnn_conv")
    node["attrs"]["dedup_sum"] = "true"
    with pytest.raises(ModelFormatError, match=rf"{node['name']}.*unknown attribute "
                                               r"'dedup_sum'"):
        engine.load_model(json.dumps(document), str(params))


def test_an_int8_batch_is_never_cut_into_runs_of_rows() -> None:
    """Uncalibrated ranges come from the whole batch: rows must not run apart."""
    from engine.runtime import batch_split

    graph = fixtures.graph("resnet18_v1_uncalibrated")
    blocker = batch_split.split_blocker(graph, batch_split.input_dependent(graph, {"data"}))
    assert blocker is not None and "_contrib_quantize_v2" in blocker


def test_an_uncalibrated_export_is_served_whole_and_a_calibrated_one_batched() -> None:
    """Without calibration each quantize takes its range from the batch at hand, so requests
    joined into one batch would change each other's outputs: the server runs them alone."""
    from pathlib import Path

    from engine.serving.config import ModelConfig
    from engine.serving.validate import default_loader, load_and_validate

    def served(name: str) -> ModelConfig:
        symbol, params = fixtures.paths(name)
        return load_and_validate(
            Path("unused"), ModelConfig(),
            loader=lambda _s, _p, *, device: default_loader(symbol, params, device=device),
            device="cpu", where=f"upload of {name}").config

    assert served("resnet18_v1_uncalibrated").max_batch_size == 0
    assert served("resnet18_v1_naive").max_batch_size > 0
