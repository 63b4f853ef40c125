"""End to end, on a real uvicorn process: GluonCV-style exports uploaded with a preprocess and a
postprocess answer photos with detection rows in the original image's pixels, class maps and
unit embeddings, on /predict (JSON objects) and V2 (typed tensors: JSON, binary, tritonclient,
gRPC), equal to a reference written here with NumPy + Pillow feeding the same
model through `engine.load_model`."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
from PIL import Image

import engine
from tests.conformance.fixtures import model_files
from tests.e2e.server import TOKEN, Server, running_server
from tests.service.image_model import encode, photo

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SSD = ("ssd0_slice_axis7_output", "ssd0_slice_axis8_output", "ssd0_slice_axis9_output")
DETECTOR_LABELS = ["cat", "dog", "bird"]
SEGMENTER = "segmenter0_bilinearresize2d0_output"
SEGMENT_LABELS = ["sky", "road", "car", "tree"]
ARCFACE = ("arcfacenet0_batchnorm3_fwd_output", "arcfacenet0_fullyconnected0_output")
FACE_LABELS = ["ann", "bob", "cy", "dan", "eve", "fay"]
PAD = 114
FILES = {"fcn_original": "gluoncv_fcn_tiny"}  # a second upload of the segmenter
# A landscape and a portrait photo: each letterboxes differently into 64x64.
PHOTOS = [encode(photo(90, 160, seed=1), "JPEG"), encode(photo(120, 70, seed=2), "JPEG")]


@dataclass(frozen=True)
class Reference:
    """What the reference pipeline gives for `PHOTOS`."""

    detections: list[list[tuple[int, float, list[float]]]]  # per photo: (class, score, box)
    threshold: float
    class_maps: np.ndarray
    embeddings: np.ndarray
    logits: np.ndarray


def _pixels(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def _letterbox(data: bytes) -> tuple[np.ndarray, tuple[float, float, int, int]]:
    """The 64x64 letterbox in NumPy + Pillow: the row, and (scale x, scale y, left, top)."""
    image = _pixels(data)
    width, height = image.size
    factor = min(64 / width, 64 / height)
    new_width, new_height = round(width * factor), round(height * factor)
    canvas = np.full((64, 64, 3), PAD, np.float64)
    top, left = (64 - new_height) // 2, (64 - new_width) // 2
    resized = image.resize((new_width, new_height), Image.Resampling.BILINEAR)
    canvas[top:top + new_height, left:left + new_width] = np.asarray(resized)
    return (canvas / 255).transpose(2, 0, 1), (new_width / width, new_height / height, left, top)


def _square(data: bytes, size: int) -> np.ndarray:
    resized = _pixels(data).resize((size, size), Image.Resampling.BILINEAR)
    return (np.asarray(resized, np.float64) / 255).transpose(2, 0, 1)


def _reference_detections() -> tuple[list[list[tuple[int, float, list[float]]]], float]:
    symbol, params = model_files("gluoncv_ssd_tiny")
    rows, geometry = zip(*(_letterbox(data) for data in PHOTOS))
    outputs = engine.load_model(symbol, params).infer(
        {"data": np.stack(rows).astype(np.float32)})
    ids, scores, boxes = (np.asarray(outputs[name]) for name in SSD)
    # A threshold in the widest gap among the middle scores: rows near it cannot flip.
    ordered = np.sort(scores[ids >= 0])[::-1]
    middle = ordered[2:len(ordered) // 2]
    gap = int(np.argmax(middle[:-1] - middle[1:]))
    assert middle[gap] - middle[gap + 1] > 1e-4
    threshold = float(middle[gap] + middle[gap + 1]) / 2
    found = []
    for row, (scale_x, scale_y, left, top) in enumerate(geometry):
        kept = [index for index in np.argsort(-scores[row, :, 0], kind="stable")
                if ids[row, index, 0] >= 0 and scores[row, index, 0] >= threshold]
        height, width = _pixels(PHOTOS[row]).size[::-1]
        found.append([(int(ids[row, index, 0]), float(scores[row, index, 0]), [
            float(np.clip((boxes[row, index, 0] - left) / scale_x, 0, width)),
            float(np.clip((boxes[row, index, 1] - top) / scale_y, 0, height)),
            float(np.clip((boxes[row, index, 2] - left) / scale_x, 0, width)),
            float(np.clip((boxes[row, index, 3] - top) / scale_y, 0, height))])
            for index in kept])
    return found, threshold


def _reference() -> Reference:
    detections, threshold = _reference_detections()
    symbol, params = model_files("gluoncv_fcn_tiny")
    segment = np.stack([_square(data, 32) for data in PHOTOS]).astype(np.float32)
    scores = np.asarray(engine.load_model(symbol, params).infer({"data": segment})[SEGMENTER])
    symbol, params = model_files("arcface_tiny")
    faces = engine.load_model(symbol, params).infer({"data": segment})
    embedding = np.asarray(faces[ARCFACE[0]], np.float64)
    unit = embedding / np.linalg.norm(embedding, axis=1, keepdims=True)
    return Reference(detections, threshold, scores.argmax(axis=1), unit,
                     np.asarray(faces[ARCFACE[1]]))


def _upload(server: Server, name: str, config: dict, labels: tuple[str, list[str]]) -> dict:
    symbol, params = model_files(FILES.get(name, name))
    files = [("symbol", ("s.json", symbol.read_bytes())),
             ("params", ("p.params", params.read_bytes())),
             ("config", ("config.json", json.dumps(config).encode())),
             ("labels", (labels[0], "\n".join(labels[1]).encode()))]
    answer = httpx.post(f"{server.admin_url}/models/{name}", files=files, headers=AUTH,
                        timeout=60)
    assert answer.status_code == 201, answer.text
    return answer.json()


def _configs(threshold: float) -> dict[str, dict]:
    square = {"image": {"resize": [32, 32], "scale": 1 / 255}}
    return {
        "gluoncv_ssd_tiny": {"max_batch_size": 4, "inputs": [{"name": "data", "preprocess": {
            "image": {"resize": {"letterbox": [64, 64], "pad_value": PAD}, "scale": 1 / 255}}}],
            "outputs": [{"name": "ids", "source": SSD[0], "labels": "classes.txt",
                         "postprocess": {"detection": {"score_threshold": threshold}}},
                        {"name": "scores", "source": SSD[1]},
                        {"name": "boxes", "source": SSD[2]}]},
        "gluoncv_fcn_tiny": {"inputs": [{"name": "data", "preprocess": square}],
                             "outputs": [{"name": "mask", "source": SEGMENTER,
                                          "labels": "classes.txt",
                                          "postprocess": "segmentation"}]},
        "fcn_original": {"inputs": [{"name": "data", "preprocess": square}],
                         "outputs": [{"name": "mask", "source": SEGMENTER,
                                      "labels": "classes.txt", "postprocess": {
                                          "segmentation": {"coordinates": "original"}}}]},
        "arcface_tiny": {"inputs": [{"name": "data", "preprocess": square}],
                         "outputs": [{"name": "embedding", "source": ARCFACE[0],
                                      "postprocess": "embedding"},
                                     {"name": "who", "source": ARCFACE[1],
                                      "labels": "classes.txt",
                                      "postprocess": {"topk": {"k": 3, "softmax": True}}}]},
    }


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Reference]]:
    """The server with the detector, segmenter and face model uploaded, and the reference."""
    reference = _reference()
    labels = {"gluoncv_ssd_tiny": DETECTOR_LABELS, "gluoncv_fcn_tiny": SEGMENT_LABELS,
              "fcn_original": SEGMENT_LABELS, "arcface_tiny": FACE_LABELS}
    root = tmp_path_factory.mktemp("postprocess") / "repository"
    with running_server(root) as server:
        for name, config in _configs(reference.threshold).items():
            answer = _upload(server, name, config, ("classes.txt", labels[name]))
            assert answer["checks"]["postprocess"]["ran"] is True
        yield server, reference


def _assert_detections(rows: list[dict], expected: list[tuple[int, float, list[float]]]) -> None:
    assert [row["class_id"] for row in rows] == [class_id for class_id, _, _ in expected]
    assert [row["label"] for row in rows] == [DETECTOR_LABELS[class_id]
                                             for class_id, _, _ in expected]
    np.testing.assert_allclose([row["score"] for row in rows], [s for _, s, _ in expected],
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.reshape([row["box"] for row in rows], (-1, 4)),
                               np.reshape([box for _, _, box in expected], (-1, 4)),
                               rtol=1e-4, atol=1e-3)


def test_predict_gives_detection_rows_in_the_original_image_s_pixels(
        served: tuple[Server, Reference]) -> None:
    server, reference = served
    assert all(reference.detections), "each photo has detections over the threshold"
    files = [("data", (f"{index}.jpg", data, "image/jpeg")) for index, data in enumerate(PHOTOS)]
    answer = httpx.post(f"{server.url}/predict?model=gluoncv_ssd_tiny", files=files, timeout=30)
    assert answer.status_code == 200, answer.text
    outputs = answer.json()["outputs"]
    assert list(outputs) == ["ids"]  # the scores and boxes are in its rows
    for rows, expected in zip(outputs["ids"], reference.detections):
        _assert_detections(rows, expected)
    # The portrait photo's boxes reach past the 64x64 input: they are in its 70x120 pixels.
    assert max(row["box"][3] for row in outputs["ids"][1]) > 64


def test_v2_gives_typed_detection_tensors_in_json_and_binary(
        served: tuple[Server, Reference]) -> None:
    import tritonclient.http as triton

    server, reference = served
    count = max(len(found) for found in reference.detections)
    metadata = httpx.get(f"{server.url}/v2/models/gluoncv_ssd_tiny").json()
    assert metadata["outputs"] == [
        {"name": "ids", "datatype": "INT32", "shape": [-1, -1]},
        {"name": "ids_label", "datatype": "BYTES", "shape": [-1, -1]},
        {"name": "scores", "datatype": "FP32", "shape": [-1, -1]},
        {"name": "boxes", "datatype": "FP32", "shape": [-1, -1, 4]}]
    body = {"inputs": [{"name": "data", "datatype": "BYTES", "shape": [2],
                        "data": [base64.b64encode(data).decode() for data in PHOTOS]}]}
    answer = httpx.post(f"{server.url}/v2/models/gluoncv_ssd_tiny/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    tensors = {tensor["name"]: tensor for tensor in answer.json()["outputs"]}
    assert {name: (tensor["datatype"], tensor["shape"]) for name, tensor in tensors.items()} == {
        "ids": ("INT32", [2, count]), "ids_label": ("BYTES", [2, count]),
        "scores": ("FP32", [2, count]), "boxes": ("FP32", [2, count, 4])}
    with triton.InferenceServerClient(server.url.removeprefix("http://")) as client:
        images = triton.InferInput("data", [2], "BYTES")
        images.set_data_from_numpy(np.array(PHOTOS, dtype=object), binary_data=True)
        result = client.infer("gluoncv_ssd_tiny", [images])
        binary = {name: result.as_numpy(name) for name in tensors}
    for name, tensor in tensors.items():
        json_values = np.reshape(tensor["data"], tensor["shape"])
        if name == "ids_label":
            np.testing.assert_array_equal(binary[name].astype(str), json_values)
        else:
            np.testing.assert_allclose(binary[name], json_values, rtol=1e-6)
    for row, expected in enumerate(reference.detections):
        rows = [{"class_id": int(binary["ids"][row, index]),
                 "label": binary["ids_label"][row, index].decode(),
                 "score": float(binary["scores"][row, index]),
                 "box": binary["boxes"][row, index].tolist()} for index in range(len(expected))]
        _assert_detections(rows, expected)
        padding = slice(len(expected), count)  # GluonCV's padding: -1 throughout, no label
        assert (binary["ids"][row, padding] == -1).all()
        assert (binary["boxes"][row, padding] == -1).all()
        assert binary["ids_label"][row, padding].tolist() == [b""] * (count - len(expected))


def test_grpc_gives_the_same_detection_tensors(served: tuple[Server, Reference]) -> None:
    # The server's own stubs: tritonclient.grpc cannot share a process with them (see
    # tests/e2e/grpc_clients.py); the wire is the same.
    import grpc

    from service.grpc import inference_pb2 as pb
    from service.grpc import inference_pb2_grpc as pb_grpc

    server, reference = served
    request = pb.ModelInferRequest(model_name="gluoncv_ssd_tiny")
    request.inputs.add(name="data", datatype="BYTES", shape=[2])
    request.raw_input_contents.append(b"".join(len(data).to_bytes(4, "little") + data
                                               for data in PHOTOS))
    request.outputs.add(name="boxes")
    request.outputs.add(name="ids")
    request.outputs.add(name="ids_label")  # answered only when asked for, as Triton answers
    with grpc.insecure_channel(server.grpc) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    count = max(len(found) for found in reference.detections)
    assert [(tensor.name, tensor.datatype, list(tensor.shape)) for tensor in response.outputs] \
        == [("boxes", "FP32", [2, count, 4]), ("ids", "INT32", [2, count]),
            ("ids_label", "BYTES", [2, count])]
    boxes = np.frombuffer(response.raw_output_contents[0], "<f4").reshape(2, count, 4)
    ids = np.frombuffer(response.raw_output_contents[1], "<i4").reshape(2, count)
    labels, raw = [], response.raw_output_contents[2]
    while raw:  # each element: a 4-byte little-endian length, then its bytes
        size = int.from_bytes(raw[:4], "little")
        labels.append(raw[4:4 + size].decode())
        raw = raw[4 + size:]
    for row, expected in enumerate(reference.detections):
        np.testing.assert_allclose(boxes[row, :len(expected)], [box for _, _, box in expected],
                                   rtol=1e-4, atol=1e-3)
        assert ids[row, :len(expected)].tolist() == [class_id for class_id, _, _ in expected]
        assert labels[row * count:row * count + len(expected)] == [
            DETECTOR_LABELS[class_id] for class_id, _, _ in expected]


def test_segmentation_answers_the_class_map_with_label_names(
        served: tuple[Server, Reference]) -> None:
    server, reference = served
    answer = httpx.post(f"{server.url}/predict?model=gluoncv_fcn_tiny", content=PHOTOS[0],
                        headers={"Content-Type": "image/jpeg"}, timeout=30)
    assert answer.status_code == 200, answer.text
    [row] = answer.json()["outputs"]["mask"]
    np.testing.assert_array_equal(row["class_map"], reference.class_maps[0])
    present, pixels = np.unique(reference.class_maps[0], return_counts=True)
    assert row["classes"] == [{"index": int(index), "pixels": int(count),
                               "label": SEGMENT_LABELS[index]}
                              for index, count in zip(present, pixels)]
    body = {"inputs": [{"name": "data", "datatype": "BYTES", "shape": [2],
                        "data": [base64.b64encode(data).decode() for data in PHOTOS]}]}
    v2 = httpx.post(f"{server.url}/v2/models/gluoncv_fcn_tiny/infer", json=body, timeout=30)
    [mask] = v2.json()["outputs"]
    assert (mask["datatype"], mask["shape"]) == ("INT32", [2, 32, 32])
    np.testing.assert_array_equal(np.reshape(mask["data"], (2, 32, 32)), reference.class_maps)


def test_embedding_is_unit_length_and_topk_gives_labelled_probabilities(
        served: tuple[Server, Reference]) -> None:
    import tritonclient.http as triton

    server, reference = served
    with triton.InferenceServerClient(server.url.removeprefix("http://")) as client:
        images = triton.InferInput("data", [2], "BYTES")
        images.set_data_from_numpy(np.array(PHOTOS, dtype=object), binary_data=True)
        result = client.infer("arcface_tiny", [images])
        classified = client.infer("arcface_tiny", [images], outputs=[
            triton.InferRequestedOutput("who", binary_data=False, class_count=2)])
    np.testing.assert_allclose(result.as_numpy("embedding"), reference.embeddings, rtol=1e-4,
                               atol=1e-5)
    logits = reference.logits.astype(np.float64)
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    top = np.argsort(-probabilities, axis=1, kind="stable")[:, :3]
    assert result.as_numpy("who_index").tolist() == top.tolist()
    np.testing.assert_allclose(result.as_numpy("who"),
                               np.take_along_axis(probabilities, top, axis=1), rtol=1e-4)
    assert result.as_numpy("who_label").tolist() == [[FACE_LABELS[index].encode()
                                                      for index in row] for row in top]
    # The classification extension still answers in Triton's format, from the raw values.
    assert classified.as_numpy("who").tolist() == [
        [f"{logits[row, index]:f}:{index}:{FACE_LABELS[index]}" for index in top[row, :2]]
        for row in range(2)]
    answer = httpx.post(f"{server.url}/predict?model=arcface_tiny", content=PHOTOS[1],
                        headers={"Content-Type": "image/jpeg"}, timeout=30).json()
    assert [entry["label"] for entry in answer["outputs"]["who"][0]] == [
        FACE_LABELS[index] for index in top[1]]
    np.testing.assert_allclose(np.linalg.norm(answer["outputs"]["embedding"][0]), 1.0,
                               rtol=1e-5)


def test_v2_answers_a_postprocess_s_extra_tensor_asked_for_alone(
        served: tuple[Server, Reference]) -> None:
    import tritonclient.http as triton

    server, reference = served
    count = max(len(found) for found in reference.detections)
    body = {"inputs": [{"name": "data", "datatype": "BYTES", "shape": [2],
                        "data": [base64.b64encode(data).decode() for data in PHOTOS]}],
            "outputs": [{"name": "ids_label"}]}
    answer = httpx.post(f"{server.url}/v2/models/gluoncv_ssd_tiny/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    [labels] = answer.json()["outputs"]
    assert (labels["name"], labels["datatype"], labels["shape"]) == (
        "ids_label", "BYTES", [2, count])
    expected = [[DETECTOR_LABELS[class_id] for class_id, _, _ in found]
                + [""] * (count - len(found)) for found in reference.detections]
    assert np.reshape(labels["data"], (2, count)).tolist() == expected
    with triton.InferenceServerClient(server.url.removeprefix("http://")) as client:
        images = triton.InferInput("data", [2], "BYTES")
        images.set_data_from_numpy(np.array(PHOTOS, dtype=object), binary_data=True)
        result = client.infer("gluoncv_ssd_tiny", [images], outputs=[
            triton.InferRequestedOutput("ids_label"), triton.InferRequestedOutput("scores")])
    assert [output["name"] for output in result.get_response()["outputs"]] == [
        "ids_label", "scores"]
    assert result.as_numpy("ids_label").astype(str).tolist() == expected


def _nearest_to_original(class_map: np.ndarray, height: int, width: int) -> np.ndarray:
    """The reference: a class map over the 32x32 input of an exact resize, read at the
    centre of each of the original image's pixels."""
    rows = np.floor((np.arange(height) + 0.5) * 32 / height).astype(int)
    columns = np.floor((np.arange(width) + 0.5) * 32 / width).astype(int)
    return class_map[rows][:, columns]


def test_segmentation_answers_class_maps_at_the_original_image_s_size(
        served: tuple[Server, Reference]) -> None:
    server, reference = served
    sizes = [_pixels(data).size[::-1] for data in PHOTOS]  # (height, width): (90, 160), ...
    expected = [_nearest_to_original(found, *size)
                for found, size in zip(reference.class_maps, sizes)]
    answer = httpx.post(f"{server.url}/predict?model=fcn_original", content=PHOTOS[1],
                        headers={"Content-Type": "image/jpeg"}, timeout=30)
    assert answer.status_code == 200, answer.text
    [row] = answer.json()["outputs"]["mask"]
    np.testing.assert_array_equal(row["class_map"], expected[1])
    present, pixels = np.unique(expected[1], return_counts=True)
    assert [(entry["index"], entry["pixels"]) for entry in row["classes"]] == list(
        zip(present.tolist(), pixels.tolist()))
    body = {"inputs": [{"name": "data", "datatype": "BYTES", "shape": [2],
                        "data": [base64.b64encode(data).decode() for data in PHOTOS]}]}
    v2 = httpx.post(f"{server.url}/v2/models/fcn_original/infer", json=body, timeout=30)
    [mask] = v2.json()["outputs"]
    height, width = max(size[0] for size in sizes), max(size[1] for size in sizes)
    assert (mask["datatype"], mask["shape"]) == ("INT32", [2, height, width])
    maps = np.reshape(mask["data"], (2, height, width))
    for found, want in zip(maps, expected):  # each padded with -1 to the larger sizes
        np.testing.assert_array_equal(found[:want.shape[0], :want.shape[1]], want)
        assert (found[want.shape[0]:] == -1).all() and (found[:, want.shape[1]:] == -1).all()
    metadata = httpx.get(f"{server.url}/v2/models/fcn_original").json()["outputs"]
    assert metadata == [{"name": "mask", "datatype": "INT32", "shape": [-1, -1, -1]}]
