"""End to end, on a real uvicorn process: a model uploaded with ``"preprocess": "imagenet"``
takes JPEG and PNG images through V2 (base64 JSON, binary BYTES, tritonclient) and /predict
(raw body, multipart), giving what the same model gives on a NumPy + Pillow reference
pipeline, in every image mode (grey, RGBA, CMYK, palette, EXIF-rotated); class counts in
Triton's format; hostile images are 400s that leave the server's memory as it was, and a bad
image among concurrent good requests fails alone."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from PIL import Image

from engine.serving.images import MAX_EXIF_BYTES
from tests.e2e.server import TOKEN, Server, running_server
from tests.service import image_model
from tests.service.image_model import (
    NAME,
    encode,
    photo,
    png_header_only,
    reference_scores,
)

pytestmark = pytest.mark.e2e
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
ORIENTATION = 0x0112  # the EXIF tag
INFER = f"/v2/models/{NAME}/infer"
IMAGES = [encode(photo(375, 500, seed=3), "JPEG"), encode(photo(320, 240, seed=4), "PNG"),
          encode(photo(224, 300, seed=5), "JPEG")]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, np.ndarray]]:
    """The server with the tiny classifier uploaded, and its reference scores on `IMAGES`."""
    symbol, params = image_model.model_files()
    root = tmp_path_factory.mktemp("images") / "repository"
    with running_server(root, ["--image-threads", "2"]) as server:
        files = {"symbol": ("s.json", symbol), "params": ("p.params", params),
                 "config": ("config.json", json.dumps(image_model.CONFIG).encode())}
        answer = httpx.post(f"{server.admin_url}/models/{NAME}", files=files, headers=AUTH,
                            timeout=60)
        assert answer.status_code == 201, answer.text
        assert answer.json()["checks"]["preprocess"]["inputs"] == {"data": [3, 224, 224]}
        yield server, reference_scores(symbol, params, IMAGES)


def _scores(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    return np.asarray(output["data"], np.float32).reshape(output["shape"])


def test_v2_json_base64_and_binary_bytes(served: tuple[Server, np.ndarray]) -> None:
    server, expected = served
    metadata = httpx.get(f"{server.url}/v2/models/{NAME}").json()
    assert metadata["inputs"] == [{"name": "data", "datatype": "BYTES", "shape": [-1]}]
    body = {"inputs": [{"name": "data", "datatype": "BYTES", "shape": [3],
                        "data": [base64.b64encode(image).decode() for image in IMAGES]}]}
    np.testing.assert_allclose(_scores(httpx.post(server.url + INFER, json=body, timeout=30)),
                               expected, **TOLERANCE)
    data = b"".join(len(image).to_bytes(4, "little") + image for image in IMAGES)
    header = orjson.dumps({"inputs": [{"name": "data", "datatype": "BYTES", "shape": [3, 1],
                                       "parameters": {"binary_data_size": len(data)}}]})
    binary = httpx.post(server.url + INFER, content=header + data, timeout=30,
                        headers={"Inference-Header-Content-Length": str(len(header))})
    np.testing.assert_allclose(_scores(binary), expected, **TOLERANCE)


def test_predict_raw_image_and_multipart_files(served: tuple[Server, np.ndarray]) -> None:
    server, expected = served
    for index, kind in ((0, "jpeg"), (1, "png")):
        raw = httpx.post(f"{server.url}/predict?model={NAME}", content=IMAGES[index],
                         headers={"Content-Type": f"image/{kind}"}, timeout=30)
        assert raw.status_code == 200, raw.text
        np.testing.assert_allclose(raw.json()["outputs"]["scores"], expected[index:index + 1],
                                   **TOLERANCE)
    files = [("data", (f"{index}.img", image, "application/octet-stream"))
             for index, image in enumerate(IMAGES)]
    form = httpx.post(f"{server.url}/predict?model={NAME}&version=1", files=files, timeout=30)
    assert form.status_code == 200, form.text
    assert (form.json()["model"], form.json()["version"]) == (NAME, 1)
    np.testing.assert_allclose(form.json()["outputs"]["scores"], expected, **TOLERANCE)


def test_tritonclient_sends_an_image_as_binary_bytes(served: tuple[Server, np.ndarray]) -> None:
    import tritonclient.http as triton

    server, expected = served
    with triton.InferenceServerClient(server.url.removeprefix("http://")) as client:
        tensor = triton.InferInput("data", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([IMAGES[0]], dtype=object), binary_data=True)
        result = client.infer(NAME, [tensor],
                              outputs=[triton.InferRequestedOutput("scores", binary_data=True)])
        np.testing.assert_allclose(result.as_numpy("scores"), expected[:1], **TOLERANCE)


def test_a_bad_image_among_concurrent_good_requests_fails_alone(
        served: tuple[Server, np.ndarray]) -> None:
    server, expected = served
    truncated = IMAGES[0][: len(IMAGES[0]) // 2]

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            bodies = [IMAGES[index % 2] for index in range(8)]
            bodies.insert(4, truncated)
            return await asyncio.gather(*(client.post(
                f"/predict?model={NAME}", content=body, headers={"Content-Type": "image/jpeg"})
                for body in bodies))

    answers = asyncio.run(send_all())
    bad = answers.pop(4)
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"].startswith(f"model '{NAME}' version 1: input 'data', batch row 0: "
                                          "JPEG image cannot be decoded (corrupt or truncated)")
    for index, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(answer.json()["outputs"]["scores"],
                                   expected[index % 2:index % 2 + 1], **TOLERANCE)
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def _modes() -> dict[str, bytes]:
    """One photo in each mode a camera or an editor writes, EXIF rotation included."""
    pixels = photo(300, 400, seed=9)
    rgb = Image.fromarray(pixels)
    exif = Image.Exif()
    exif[ORIENTATION] = 6  # rotated 90 degrees; the reference pipeline applies it too
    return {"grey JPEG": _saved(rgb.convert("L"), "JPEG"),
            "RGBA PNG": _saved(rgb.convert("RGBA"), "PNG"),
            "CMYK JPEG": _saved(rgb.convert("CMYK"), "JPEG"),
            "palette PNG": _saved(rgb.convert("P"), "PNG"),
            "EXIF-rotated JPEG": _saved(rgb, "JPEG", exif=exif.tobytes())}


def _saved(image: Image.Image, kind: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, kind, **options)
    return buffer.getvalue()


def test_every_image_mode_gives_the_reference_top_classes(
        served: tuple[Server, np.ndarray]) -> None:
    server, _ = served
    modes = _modes()
    symbol, params = image_model.model_files()
    expected = reference_scores(symbol, params, list(modes.values()))
    body = {"inputs": [{"name": "data", "datatype": "BYTES", "shape": [len(modes)],
                        "data": [base64.b64encode(image).decode() for image in modes.values()]}]}
    scores = _scores(httpx.post(server.url + INFER, json=body, timeout=30))
    np.testing.assert_allclose(scores, expected, **TOLERANCE)
    files = [("data", (f"{index}.img", image, "application/octet-stream"))
             for index, image in enumerate(modes.values())]
    form = httpx.post(f"{server.url}/predict?model={NAME}", files=files, timeout=30)
    assert form.status_code == 200, form.text
    for mode, row, want in zip(modes, form.json()["outputs"]["scores"], expected):
        assert np.argsort(row)[::-1][:3].tolist() == np.argsort(want)[::-1][:3].tolist(), mode


def test_class_count_strings_are_tritons_format_byte_for_byte(
        served: tuple[Server, np.ndarray]) -> None:
    import tritonclient.http as triton

    server, _ = served
    with triton.InferenceServerClient(server.url.removeprefix("http://")) as client:
        for mode, image in _modes().items():
            tensor = triton.InferInput("data", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([image], dtype=object), binary_data=True)
            raw = client.infer(NAME, [tensor], outputs=[
                triton.InferRequestedOutput("scores", binary_data=True)]).as_numpy("scores")[0]
            top = client.infer(NAME, [tensor], outputs=[
                triton.InferRequestedOutput("scores", binary_data=True, class_count=3)])
            # Triton prints the value as std::to_string does ("%f") and sorts by the value.
            order = np.argsort(-raw, kind="stable")[:3]
            want = [f"{float(raw[index]):f}:{index}".encode() for index in order]
            assert top.as_numpy("scores")[0].tolist() == want, mode


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def _hostile() -> dict[str, tuple[bytes, str]]:
    """Each hostile image and a fragment of the error that must name its problem."""
    strip = _saved(Image.fromarray(np.full((1, 100000, 3), 90, np.uint8)), "PNG")
    huge_exif = _saved(Image.fromarray(photo(8, 8)), "PNG",
                       exif=b"Exif\x00\x00MM\x00*" + b"\x00" * (MAX_EXIF_BYTES + 10))
    return {"empty": (b"", "image is empty (0 bytes)"),
            "truncated": (IMAGES[0][:len(IMAGES[0]) // 3], "corrupt or truncated"),
            "wrong magic": (b"GIF89a" + b"\x00" * 64, "image format GIF is not accepted"),
            "bomb": (png_header_only(20000, 20000), "the limit is"),
            "huge EXIF": (huge_exif, "EXIF block is"),
            "1x100000": (strip, "aspect ratio is too extreme")}


def test_hostile_images_are_400s_and_leave_the_server_as_it_was(
        served: tuple[Server, np.ndarray]) -> None:
    server, expected = served
    hostile = _hostile()
    assert len(hostile["bomb"][0]) < 1 << 20

    def predict(body: bytes) -> httpx.Response:
        return httpx.post(f"{server.url}/predict?model={NAME}", content=body, timeout=30,
                          headers={"Content-Type": "image/png"})

    assert predict(IMAGES[1]).status_code == 200
    before = _rss_bytes(server.process.pid)
    for _ in range(3):
        for name, (body, message) in hostile.items():
            answer = predict(body)
            assert answer.status_code == 400, (name, answer.text)
            assert message in answer.json()["error"], (name, answer.text)
            assert "batch row 0" in answer.json()["error"], (name, answer.text)
    growth = _rss_bytes(server.process.pid) - before
    assert growth < 64 << 20, f"RSS grew by {growth / 2**20:.1f} MiB"
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    good = predict(IMAGES[1])
    np.testing.assert_allclose(good.json()["outputs"]["scores"], expected[1:2], **TOLERANCE)
