"""``postprocess`` in config.json: refused when it is not valid data, then checked against the
graph at upload (label counts, a detector's outputs, the geometry to map its boxes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.serving.config import TensorConfig, parse_config
from engine.serving.errors import InvalidModel
from engine.serving.postprocess_check import resolve_detection
from engine.serving.postprocess_config import Detection, Postprocess, Softmax, TopK
from engine.serving.validate import checks_of, default_loader, load_and_validate
from tests.conformance.fixtures import model_files

SSD = ("ssd0_slice_axis7_output", "ssd0_slice_axis8_output", "ssd0_slice_axis9_output")
LETTERBOX = {"image": {"resize": {"letterbox": [64, 64], "pad_value": 114}, "scale": 1 / 255}}
SEGMENTER = "segmenter0_bilinearresize2d0_output"


def _outputs(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"outputs": list(entries)}


@pytest.mark.parametrize(("postprocess", "message"), [
    ({"topk": {"k": 5, "sort": True}}, r"outputs.0.postprocess.topk.sort: Extra inputs are not "
                                       r"permitted"),
    ({"topk": {}}, r"outputs.0.postprocess.topk.k: Field required"),
    ({"topk": {"k": 0}}, r"outputs.0.postprocess.topk.k: Input should be greater than or equal"),
    ({"topk": {"k": True}}, r"outputs.0.postprocess.topk.k: Input should be a valid integer"),
    ({"softmax": {}, "topk": {"k": 1}}, r"outputs.0.postprocess: give exactly one of softmax, "
                                        r"topk, detection, segmentation, embedding; got "
                                        r"softmax, topk"),
    ("argmax", r"outputs.0.postprocess: unknown postprocess 'argmax'"),
    ({"detection": {"score_threshold": "high"}}, r"outputs.0.postprocess.detection."
                                                 r"score_threshold: .*expected a number"),
    ({"detection": {"coordinates": "normalised"}}, r"outputs.0.postprocess.detection."
                                                   r"coordinates: Input should be 'original' "
                                                   r"or 'input'"),
    ({"segmentation": {"resize": True}}, r"outputs.0.postprocess.segmentation.resize: Extra "
                                         r"inputs are not permitted"),
])
def test_invalid_postprocess_data_is_refused_naming_the_field(postprocess: Any,
                                                              message: str) -> None:
    with pytest.raises(InvalidModel, match=f"upload: {message}"):
        parse_config(_outputs({"name": "scores", "postprocess": postprocess}), "upload")


def test_shorthands_and_defaults_parse_and_the_completed_config_parses_again() -> None:
    config = parse_config(_outputs({"name": "a", "postprocess": "softmax"},
                                   {"name": "b", "postprocess": {"topk": {"k": 3}}}), "upload")
    assert config.outputs is not None
    assert config.outputs[0].postprocess.softmax == Softmax(axis=-1)
    assert config.outputs[1].postprocess.topk == TopK(k=3, softmax=False)
    assert config.outputs[1].postprocess.kind == "topk"
    assert parse_config(config.to_json(), "again") == config


@pytest.mark.parametrize(("config", "message"), [
    ({"inputs": [{"name": "data", "postprocess": "softmax"}]},
     r"inputs \['data'\]: postprocess belongs to outputs"),
    (_outputs({"name": "e", "labels": "l.txt", "postprocess": "embedding"}),
     r"outputs.0.postprocess \(output 'e'\): an embedding has no classes to label"),
    (_outputs({"name": "ids", "postprocess": {"detection": {"boxes": "ids"}}}),
     r"detection's scores and boxes must be two other outputs"),
    (_outputs({"name": "ids", "postprocess": {"detection": {"boxes": "bbox"}}}),
     r"detection names output 'bbox', which is not one of the outputs \['ids'\]"),
    (_outputs({"name": "ids", "postprocess": {"detection": {"boxes": "b"}}},
              {"name": "b", "postprocess": "softmax"}),
     r"output 'b' is part of this detection and cannot have a postprocess of its own"),
    (_outputs({"name": "p", "postprocess": {"topk": {"k": 2}}}, {"name": "p_index"}),
     r"answers with tensors \['p_index'\], which are also outputs' names"),
])
def test_inconsistent_postprocesses_are_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidModel, match=message):
        parse_config(config, "upload")


# The checks at upload.

def _validate(name: str, config: dict[str, Any], folder: Path = Path("unused")) -> Any:
    symbol, params = model_files(name)

    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        return default_loader(symbol, params, device=device)

    return load_and_validate(folder, parse_config(config, "upload"), loader=loader,
                             device="cpu", where=f"upload of {name}")


def _ssd(ids: dict[str, Any], *, preprocess: Any = LETTERBOX) -> dict[str, Any]:
    inputs = [{"name": "data", **({"preprocess": preprocess} if preprocess else {})}]
    return {"inputs": inputs,
            "outputs": [{"name": "ids", "source": SSD[0], **ids},
                        {"name": "scores", "source": SSD[1]},
                        {"name": "boxes", "source": SSD[2]}]}


def test_a_detector_s_scores_boxes_and_input_are_inferred_and_recorded() -> None:
    validated = _validate("gluoncv_ssd_tiny", _ssd({"postprocess": {"detection": {}}}))
    detection = validated.config.outputs[0].postprocess.detection
    assert detection == Detection(scores="scores", boxes="boxes", input="data")
    record = checks_of(validated.model).as_dict()["postprocess"]
    assert record == {"ran": True, "outputs": {"ids": "detection"}}


def test_a_detector_on_the_wrong_output_or_with_the_wrong_names_is_refused() -> None:
    on_boxes = _ssd({})
    on_boxes["outputs"][2]["postprocess"] = "detection"
    with pytest.raises(InvalidModel, match=r"upload of gluoncv_ssd_tiny: outputs.2.postprocess: "
                                           r"detection goes on the class-ids output.*output "
                                           r"'boxes' has shape \[-1, -1, 4\]"):
        _validate("gluoncv_ssd_tiny", on_boxes)
    swapped = _ssd({"postprocess": {"detection": {"scores": "boxes"}}})
    with pytest.raises(InvalidModel, match=r"outputs.0.postprocess: detection scores 'boxes' "
                                           r"\(shape \[-1, -1, 4\]\) is not a scores output"):
        _validate("gluoncv_ssd_tiny", swapped)
    with pytest.raises(InvalidModel, match=r"detection goes on the class-ids output"):
        _validate("gluoncv_fcn_tiny", {"outputs": [{"name": "ids", "source": SEGMENTER,
                                                    "postprocess": "detection"}]})


def test_mapping_boxes_needs_an_image_preprocess_on_the_input() -> None:
    without = _ssd({"postprocess": "detection"}, preprocess=None)
    with pytest.raises(InvalidModel, match=r"outputs.0.postprocess: boxes are mapped to the "
                                           r"original image through an input's image "
                                           r"preprocess, and the model has 0 such inputs"):
        _validate("gluoncv_ssd_tiny", without)
    kept = _ssd({"postprocess": {"detection": {"coordinates": "input"}}}, preprocess=None)
    assert _validate("gluoncv_ssd_tiny", kept).config.outputs[0].postprocess.detection.boxes \
        == "boxes"
    with pytest.raises(InvalidModel, match=r"input 'image' is not an input with an "
                                           r"image preprocess \(those are \['data'\]\)"):
        _validate("gluoncv_ssd_tiny", _ssd({"postprocess": {"detection": {"input": "image"}}}))


def test_label_counts_follow_the_class_dimension_of_each_kind(tmp_path: Path) -> None:
    (tmp_path / "four.txt").write_text("sky\nroad\ncar\ntree\n")
    (tmp_path / "three.txt").write_text("a\nb\nc\n")

    def segmenter(labels: str) -> dict[str, Any]:
        return {"outputs": [{"name": "mask", "source": SEGMENTER, "labels": labels,
                             "postprocess": "segmentation"}]}

    assert _validate("gluoncv_fcn_tiny", segmenter("four.txt"), tmp_path).config.outputs[0] \
        .postprocess.segmentation is not None
    with pytest.raises(InvalidModel, match=r"outputs.0.labels: 'three.txt' has 3 labels; output "
                                           r"'mask' \(shape \[-1, 4, 32, 32\]\) has 4 classes"):
        _validate("gluoncv_fcn_tiny", segmenter("three.txt"), tmp_path)
    # A detector's class ids are values: the labels file is not bound by a shape.
    labelled = _ssd({"labels": "three.txt", "postprocess": "detection"})
    assert _validate("gluoncv_ssd_tiny", labelled, tmp_path).config.outputs[0].labels \
        == "three.txt"


def test_kinds_that_do_not_fit_their_output_are_refused() -> None:
    with pytest.raises(InvalidModel, match=r"outputs.0.postprocess: segmentation needs class "
                                           r"scores \[N, C, H, W\]; output 'emb' \(FP32 "
                                           r"\[-1, 16\]\)"):
        _validate("arcface_tiny", {"outputs": [
            {"name": "emb", "source": "arcfacenet0_batchnorm3_fwd_output",
             "postprocess": "segmentation"}, {"name": "logits",
                                              "source": "arcfacenet0_fullyconnected0_output"}]})
    with pytest.raises(InvalidModel, match=r"softmax axis 0 is not a class axis of output 'mask'"):
        _validate("gluoncv_fcn_tiny", {"outputs": [{"name": "mask", "source": SEGMENTER,
                                                    "postprocess": {"softmax": {"axis": 0}}}]})


def test_a_model_without_postprocess_records_none() -> None:
    validated = _validate("gluoncv_fcn_tiny", {})
    assert "postprocess" not in checks_of(validated.model).as_dict()


def test_centernet_s_two_dimensional_ids_and_scores_are_found_by_shape() -> None:
    names = ("centernet0_centernetdecoder0_cast1_output",
             "centernet0_centernetdecoder0_topk0_value",
             "centernet0_centernetdecoder0__mulscalar0_output")
    config = {"outputs": [
        {"name": "ids", "source": names[0], "postprocess": {"detection": {
            "coordinates": "input"}}},
        {"name": "scores", "source": names[1]}, {"name": "boxes", "source": names[2]}]}
    validated = _validate("gluoncv_center_net_tiny", config)
    detection = validated.config.outputs[0].postprocess.detection
    assert (detection.scores, detection.boxes, detection.input) == ("scores", "boxes", None)


def _tensor(name: str, shape: list[int], **fields: Any) -> TensorConfig:
    return TensorConfig(name=name, datatype="FP32", shape=tuple(shape), **fields)


def test_an_ambiguous_or_inconsistent_detector_is_refused_asking_for_names() -> None:
    ids = _tensor("ids", [-1, 20, 1], postprocess={"detection": {"coordinates": "input"}})
    two = [ids, _tensor("a", [-1, 20, 1]), _tensor("b", [-1, 20, 1]),
           _tensor("boxes", [-1, 20, 4])]
    with pytest.raises(InvalidModel, match=r"f: cannot tell which output is the detection's "
                                           r"scores: 2 of the other outputs .* fit; name it "
                                           r"\(\"scores\": \"<output name>\"\)"):
        resolve_detection("f", ids, [], two)
    named = ids.model_copy(update={"postprocess": Postprocess(detection=Detection(
        scores="b", coordinates="input"))})
    assert resolve_detection("f", named, [], two).scores == "b"
    uneven = [ids, _tensor("a", [-1, 20, 1]), _tensor("boxes", [-1, 10, 4])]
    with pytest.raises(InvalidModel, match=r"must have one row count R"):
        resolve_detection("f", ids, [], uneven)


def _segmenter(segmentation: dict[str, Any], *, preprocess: Any = LETTERBOX) -> dict[str, Any]:
    inputs = [{"name": "data", **({"preprocess": preprocess} if preprocess else {})}]
    return {"inputs": inputs, "outputs": [{"name": "mask", "source": SEGMENTER,
                                           "postprocess": {"segmentation": segmentation}}]}


def test_class_maps_in_original_pixels_need_an_image_input_which_is_recorded() -> None:
    square = {"image": {"resize": [32, 32]}}
    validated = _validate("gluoncv_fcn_tiny", _segmenter({"coordinates": "original"},
                                                         preprocess=square))
    segmentation = validated.config.outputs[0].postprocess.segmentation
    assert (segmentation.coordinates, segmentation.input) == ("original", "data")
    default = _validate("gluoncv_fcn_tiny", _segmenter({}, preprocess=None))
    assert default.config.outputs[0].postprocess.segmentation.coordinates == "output"
    with pytest.raises(InvalidModel, match=r"outputs.0.postprocess: class maps are mapped to "
                                           r"the original image through an input's image "
                                           r"preprocess, and the model has 0 such inputs \[\]: "
                                           r".*or set \"coordinates\": \"output\""):
        _validate("gluoncv_fcn_tiny", _segmenter({"coordinates": "original"}, preprocess=None))
    with pytest.raises(InvalidModel, match=r"outputs.0.postprocess.segmentation.coordinates: "
                                           r"Input should be 'output' or 'original'"):
        parse_config(_segmenter({"coordinates": "input"}), "upload")
