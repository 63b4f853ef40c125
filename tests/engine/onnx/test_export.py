"""`engine.onnx.export` and its command line: options, errors and external data."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")  # an optional dev dependency; installed by `make test`

import engine  # noqa: E402
from engine import sym  # noqa: E402
from engine.onnx import OnnxExportError, export, supported_ops  # noqa: E402
from engine.onnx.__main__ import main as export_onnx  # noqa: E402
from engine.onnx.refused import REFUSED  # noqa: E402
from engine.ops import registry  # noqa: E402
from service.__main__ import main as hybridserve  # noqa: E402
from tests.conformance.fixtures import (  # noqa: E402
    DEFAULT_TOLERANCE,
    assert_close,
    model_files,
    model_io_sets,
)
from tests.engine.onnx.helpers import check, one_op_symbol, run  # noqa: E402

LENET_SHAPE = {"data": (1, 1, 28, 28)}


def _lenet_expected() -> tuple[dict, np.ndarray]:
    feed, expected = model_io_sets("lenet")[0]
    return feed, expected[0]


@pytest.mark.parametrize("opset", [17, 18, 21])
def test_each_supported_opset_gives_the_same_outputs(opset: int, tmp_path) -> None:
    data = sym.var("data")
    net = sym.mean(sym.softmax(sym.FullyConnected(data, num_hidden=4, name="fc"), axis=-1),
                   axis=1, keepdims=True)
    params = {"fc_weight": np.arange(12, dtype=np.float32).reshape(4, 3) / 10,
              "fc_bias": np.ones(4, np.float32)}
    path = export((net, params), tmp_path / "m.onnx", opset=opset, input_shapes={"data": (2, 3)})
    assert check(path).opset_import[0].version == opset
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    expected = next(iter(engine.load_model(net, params).infer({"data": x}).values()))
    assert_close(run(path, {"data": x})[0], expected, DEFAULT_TOLERANCE, f"opset {opset}")


def test_unsupported_opset_is_refused(tmp_path) -> None:
    with pytest.raises(OnnxExportError, match="opset 12 is not supported; choose 17 to 21"):
        export(model_files("lenet"), tmp_path / "m.onnx", opset=12, input_shapes=LENET_SHAPE)


def test_an_op_without_mapping_names_the_node_and_op(tmp_path) -> None:
    # ONNX has no cube root, and Pow(x, 1/3) is NaN for negative x.
    symbol = one_op_symbol("cbrt", {}, ["x"], name="root")
    with pytest.raises(OnnxExportError, match=r"node 'root' \(cbrt\): the op has no ONNX "
                                              "mapping: ONNX has no cube root"):
        export((symbol, None), tmp_path / "m.onnx", input_shapes={"x": (2, 3)})
    assert not (tmp_path / "m.onnx").exists()


def test_unknown_input_sizes_ask_for_an_example_shape(tmp_path) -> None:
    with pytest.raises(OnnxExportError, match=r"input 'data' .*input_shapes=\{'data'"):
        export(model_files("lenet"), tmp_path / "m.onnx")
    with pytest.raises(OnnxExportError, match="input_shapes names 'image', which is not an "
                                              "input; inputs are: data"):
        export(model_files("lenet"), tmp_path / "m.onnx", input_shapes={"image": (1, 1, 28, 28)})


def test_large_models_keep_their_weights_in_an_external_file(tmp_path) -> None:
    path = export(model_files("lenet"), tmp_path / "lenet.onnx", input_shapes=LENET_SHAPE,
                  external_data_threshold=1024)
    data_file = tmp_path / "lenet.onnx.data"
    assert data_file.stat().st_size > path.stat().st_size  # the weights moved out
    check(path)
    feed, expected = _lenet_expected()
    assert_close(run(path, feed)[0], expected, DEFAULT_TOLERANCE, "external data")
    small = export(model_files("lenet"), tmp_path / "inline.onnx", input_shapes=LENET_SHAPE)
    assert small.stat().st_size > data_file.stat().st_size
    assert not (tmp_path / "inline.onnx.data").exists()


def test_static_batch_keeps_the_given_shape(tmp_path) -> None:
    path = export(model_files("lenet"), tmp_path / "m.onnx", input_shapes={"data": (2, 1, 28, 28)},
                  dynamic_batch=False)
    dims = check(path).graph.input[0].type.tensor_type.shape.dim
    assert [dim.dim_value for dim in dims] == [2, 1, 28, 28]


def test_command_line_writes_a_working_file(tmp_path, capsys) -> None:
    symbol, params = model_files("lenet")
    out = tmp_path / "lenet.onnx"
    status = export_onnx([str(symbol), str(params), str(out), "--opset", "18",
                          "--input-shape", "data=1,1,28,28"])
    assert status == 0
    assert f"wrote {out}" in capsys.readouterr().out
    feed, expected = _lenet_expected()
    assert_close(run(out, feed)[0], expected, DEFAULT_TOLERANCE, "cli")


def test_command_line_reports_bad_input_without_a_traceback(tmp_path, capsys) -> None:
    symbol, params = model_files("lenet")
    status = export_onnx([str(symbol), str(params), str(tmp_path / "m.onnx")])
    assert status == 2
    assert "export-onnx: input 'data'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        export_onnx([str(symbol), str(params), str(tmp_path / "m.onnx"), "--input-shape", "x"])
    assert "expected NAME=D0,D1,..." in capsys.readouterr().err


def test_hybridserve_dispatches_export_onnx(tmp_path) -> None:
    symbol, params = model_files("lenet")
    out = tmp_path / "lenet.onnx"
    assert hybridserve(["export-onnx", str(symbol), str(params), str(out),
                        "--input-shape", "data=1,1,28,28"]) == 0
    check(out)


def test_a_size_baked_in_from_the_batch_axis_is_refused(tmp_path) -> None:
    symbol = one_op_symbol("sort", {"axis": "0"}, ["x"], name="by_batch")
    with pytest.raises(OnnxExportError, match=r"node 'by_batch' \(sort\): needs the size of "
                                              "axis 0 of input 0 at export time"):
        export((symbol, None), tmp_path / "m.onnx", input_shapes={"x": (4, 3)})
    path = export((symbol, None), tmp_path / "m.onnx", input_shapes={"x": (4, 3)},
                  dynamic_batch=False)
    x = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_array_equal(run(path, {"x": x})[0], np.sort(x, axis=0))


def test_adaptive_pooling_over_a_height_that_follows_the_batch_is_refused(tmp_path) -> None:
    # The batch folded into the height: the averaging matrices would be built for one batch size.
    symbol = one_op_symbol("Reshape", {"shape": "(1, 3, -1, 5)"}, ["x"], name="fold")
    symbol["nodes"].append({"op": "_contrib_AdaptiveAvgPooling2D", "name": "pool",
                            "attrs": {"output_size": "(3, 2)"}, "inputs": [[1, 0, 0]]})
    symbol["node_row_ptr"].append(3)
    symbol["heads"] = [[2, 0, 0]]
    with pytest.raises(OnnxExportError, match=r"node 'pool' \(_contrib_AdaptiveAvgPooling2D\): "
                                              "needs the size of axis 2 of input 0 at export"):
        export((symbol, None), tmp_path / "m.onnx", input_shapes={"x": (2, 3, 4, 5)})
    assert not (tmp_path / "m.onnx").exists()


def test_every_registered_op_is_mapped_refused_or_folded() -> None:
    # Ops without inputs (_arange, _eye, windows) are always folded into constants first.
    unmapped = sorted(name for name, opdef in registry._REGISTRY.items()
                      if name == opdef.name and opdef.inputs != ()
                      and name not in supported_ops() and name not in REFUSED)
    assert unmapped == []
    assert not set(REFUSED) & set(supported_ops())
    assert all(reason for reason in REFUSED.values())


def test_an_op_needing_a_later_opset_says_which(tmp_path) -> None:
    symbol = one_op_symbol("_npi_bitwise_and", {}, ["x", "y"], name="masked")
    shapes = {"input_shapes": {"x": (2, 3), "y": (2, 3)},
              "input_dtypes": {"x": np.int32, "y": np.int32}}
    with pytest.raises(OnnxExportError, match=r"node 'masked' \(_npi_bitwise_and\): needs ONNX "
                                              "opset 18 or later .*export with opset=18"):
        export((symbol, None), tmp_path / "m.onnx", dynamic_batch=False, **shapes)
    path = export((symbol, None), tmp_path / "m.onnx", opset=18, dynamic_batch=False, **shapes)
    x, y = (np.arange(6, dtype=np.int32).reshape(2, 3) * k for k in (3, 5))
    np.testing.assert_array_equal(run(path, {"x": x, "y": y})[0], x & y)


def test_slice_assignment_keeps_a_whole_batch_axis_dynamic(tmp_path) -> None:
    symbol = one_op_symbol("_slice_assign_scalar",
                           {"scalar": "-1", "begin": "(None, 3)", "end": "(None, 0)",
                            "step": "(None, -2)"}, ["x"])
    path = export((symbol, None), tmp_path / "m.onnx", input_shapes={"x": (2, 5)})
    x = np.random.default_rng(3).normal(size=(6, 5)).astype(np.float32)  # another batch size
    expected = x.copy()
    expected[:, 3:0:-2] = -1
    check(path)
    np.testing.assert_array_equal(run(path, {"x": x})[0], expected)


def test_slice_assignment_on_the_batch_axis_asks_for_a_static_export(tmp_path) -> None:
    symbol = one_op_symbol("_slice_assign_scalar", {"begin": "(1,)", "end": "(2,)"}, ["x"],
                           name="assign")
    with pytest.raises(OnnxExportError, match=r"node 'assign' \(_slice_assign_scalar\): needs "
                                              "the size of axis 0 .* dynamic_batch=False"):
        export((symbol, None), tmp_path / "m.onnx", input_shapes={"x": (3, 4)})
    path = export((symbol, None), tmp_path / "m.onnx", input_shapes={"x": (3, 4)},
                  dynamic_batch=False)
    x = np.ones((3, 4), np.float32)
    check(path)
    assert run(path, {"x": x})[0].tolist() == [[1] * 4, [0] * 4, [1] * 4]
