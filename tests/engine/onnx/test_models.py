"""Every conformance model exported to ONNX reproduces MXNet's outputs under ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")  # an optional dev dependency; installed by `make test`

import engine  # noqa: E402
from engine.gluon.model_zoo import vision  # noqa: E402
from engine.onnx import export  # noqa: E402
from tests.conformance.fixtures import (  # noqa: E402
    DEFAULT_TOLERANCE,
    assert_close,
    model_files,
    model_io_sets,
    model_meta,
    model_names,
    tolerance_for,
)
from tests.engine.onnx.helpers import check, input_dims, run  # noqa: E402


def _export(name: str, directory, opset: int = 17) -> object:
    shapes = {spec["name"]: spec["shape"] for spec in model_meta(name)["inputs"]}
    return export(model_files(name), directory / f"{name}.onnx", input_shapes=shapes,
                  opset=opset)


def _tolerance(name: str, expected: np.ndarray) -> dict[str, float]:
    return model_meta(name).get("tolerance") or tolerance_for(expected.dtype)


EXPORTED = model_names()


@pytest.mark.parametrize("name", EXPORTED)
def test_model_matches_mxnet(name: str, tmp_path) -> None:
    path = _export(name, tmp_path)
    model = check(path)
    assert all(dims[0] == "batch" for dims in input_dims(model).values())
    for feed, expected in model_io_sets(name):
        outputs = run(path, feed)
        assert len(outputs) == len(expected)
        for k, (actual, want) in enumerate(zip(outputs, expected)):
            assert_close(actual, want, _tolerance(name, want), f"{name} output {k}")


# Outputs whose rows start with their image's position in the batch (MultiProposal's ROIs):
# in a regrouped batch that column is each image's new position, not the fixture's.
IMAGE_INDEX_OUTPUTS = {"mxnet_rcnn_tiny": {0}}


def _regrouped(name: str, k: int, pieces: list[np.ndarray]) -> np.ndarray:
    """The expected output ``k`` of the images of ``pieces`` run as one batch."""
    whole = np.concatenate(pieces)
    if k in IMAGE_INDEX_OUTPUTS.get(name, ()):
        whole = whole.copy()
        whole[:, :, 0] = np.arange(len(whole), dtype=whole.dtype)[:, None]
    return whole


@pytest.mark.parametrize("name", EXPORTED)
def test_model_takes_batch_one_and_a_larger_batch(name: str, tmp_path) -> None:
    path = _export(name, tmp_path)
    feed, expected = model_io_sets(name)[0]
    single = run(path, {key: value[:1] for key, value in feed.items()})
    grown = run(path, {key: np.concatenate([value, value[:1], value]) for key, value in
                       feed.items()})
    for k, want in enumerate(expected):
        assert_close(single[k], want[:1], _tolerance(name, want), f"{name} batch 1")
        assert_close(grown[k], _regrouped(name, k, [want, want[:1], want]),
                     _tolerance(name, want), f"{name} batch {2 * len(want) + 1}")


@pytest.mark.parametrize("name", ["gluoncv_ssd_tiny", "gluonnlp_bert_tiny"])
def test_detection_and_attention_models_at_the_latest_opset(name: str, tmp_path) -> None:
    # box_nms's Loop, GatherND with batch_dims and the attention reshapes at opset 21.
    path = _export(name, tmp_path, opset=21)
    assert check(path).opset_import[0].version == 21
    feed, expected = model_io_sets(name)[0]
    for k, (actual, want) in enumerate(zip(run(path, feed), expected)):
        assert_close(actual, want, _tolerance(name, want), f"{name} opset 21 output {k}")


ZOO = [("resnet18_v1", (1, 3, 32, 32)), ("resnet50_v2", (1, 3, 32, 32)),
       ("mobilenetv2_0.25", (1, 3, 32, 32))]


@pytest.mark.parametrize(("name", "shape"), ZOO, ids=[name for name, _ in ZOO])
def test_model_zoo_family_matches_the_engine(name: str, shape: tuple, tmp_path) -> None:
    # No MXNet outputs exist for the zoo here: the reference is the engine's interpreter,
    # which the conformance suite holds to MXNet's outputs op by op.
    net = vision.get_model(name)
    net.initialize()
    net.hybridize()
    net(engine.nd.zeros(shape))
    net.export(str(tmp_path / name))
    files = (tmp_path / f"{name}-symbol.json", tmp_path / f"{name}-0000.params")
    path = export(files, tmp_path / f"{name}.onnx", input_shapes={"data": shape})
    check(path)
    reference = engine.load_model(*files, optimize=False)
    data = np.random.default_rng(5).normal(size=(3, *shape[1:])).astype(np.float32)
    expected = next(iter(reference.infer({"data": data}).values()))
    assert_close(run(path, {"data": data})[0], expected, DEFAULT_TOLERANCE, name)


def test_outputs_that_follow_the_batch_are_named_batch(tmp_path) -> None:
    model = check(_export("lenet", tmp_path))
    dims = [[dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]
            for value in model.graph.output]
    assert dims == [["batch", 10]]
