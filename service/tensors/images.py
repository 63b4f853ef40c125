"""Images: ``/predict`` image bodies to BYTES tensors, and BYTES images to the model's float rows.

A raw ``image/*`` body sent to ``/predict`` is one image for the model's one pipeline input; the
model (and optionally the version) is named in the query string,
``/predict?model=resnet&version=2``. A ``multipart/form-data`` body holds one part per image,
named after its input: several parts of one name are several batch rows, in order. The whole
body is already in memory (bounded by ``max_request_bytes``), so the parts are parsed from it in
one pass (`service.tensors.multipart.FormParts`).

An input with a ``preprocess`` pipeline takes a ``BYTES`` tensor, one encoded image per batch
row (`bytes` from binary data or multipart parts; `str` from JSON, read as base64). Each row is
decoded and preprocessed on a small bounded pool of threads, off the event loop (Pillow and
NumPy release the GIL while they work), and the rows are stacked into the tensor the model
takes; the request then goes to the batcher like any other. A bad image refuses its own request
only, naming the input and the row. The same pool tokenises texts (`service.tensors.text`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import parse_qs

import numpy as np
from python_multipart.multipart import parse_options_header

from engine.errors import InputError
from engine.serving.loaded import LoadedVersion
from engine.serving.preprocess import Geometry, preprocess_image
from engine.serving.preprocess_config import ImagePreprocess
from engine.serving.text import TextPipeline
from service.errors import BadRequest
from service.tensors.datatypes import object_array
from service.tensors.multipart import FormParts
from service.tensors.text import text_tensors

MULTIPART = "multipart/form-data"
QUERY_KEYS = ("model", "version")


@dataclass(frozen=True)
class ImageRequest:
    """The model a ``/predict`` image body is for, and its images by input name."""

    model: str
    version: str | None
    images: dict[str, list[bytes]] | None  # None: a raw body, for the one pipeline input
    raw: bytes = b""


def is_image_body(content_type: str | None) -> bool:
    """Whether a ``/predict`` body of this Content-Type holds images rather than JSON."""
    if not content_type:
        return False
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind.startswith("image/") or kind == MULTIPART


def read_query(query: str) -> tuple[str, str | None]:
    """``model`` (required) and ``version`` from the query string of an image ``/predict``."""
    try:
        values = parse_qs(query, keep_blank_values=True, max_num_fields=8)
    except ValueError as error:
        raise BadRequest(f"predict query string {query!r:.100} cannot be read: {error}") from None
    unknown = sorted(set(values) - set(QUERY_KEYS))
    if unknown:
        raise BadRequest(f"predict query: unknown parameters {unknown}; expected model, version")
    if any(len(given) > 1 for given in values.values()):
        raise BadRequest("predict query: give model and version once each")
    model = values.get("model", [""])[0]
    if not model:
        raise BadRequest("an image sent to /predict needs the model in the query string: "
                         "POST /predict?model=NAME (and optionally &version=N)")
    return model, values.get("version", [None])[0] or None


def read_image_request(body: bytes, content_type: str, query: str) -> ImageRequest:
    """The images of a raw ``image/*`` or multipart ``/predict`` body."""
    model, version = read_query(query)
    kind, options = parse_options_header(content_type)
    if kind.decode("latin-1").lower() != MULTIPART:
        return ImageRequest(model, version, None, body)
    boundary = options.get(b"boundary")
    if not boundary:
        raise BadRequest(f"Content-Type {content_type!r:.200} has no boundary")
    return ImageRequest(model, version, FormParts(boundary).parse(body))


def as_tensors(images: Mapping[str, list[bytes]]) -> dict[str, np.ndarray]:
    """Each input's images as a BYTES tensor of shape ``[N]``."""
    return {name: object_array(parts, (len(parts),)) for name, parts in images.items()}


def image_bytes(element: object) -> bytes:
    """One row's encoded image: binary data as it is, a JSON string as base64 (whitespace
    such as a line-wrapped encoder's newlines ignored).

    Raises:
        InputError: the string is not base64.
    """
    if isinstance(element, bytes):
        return element
    assert isinstance(element, str)  # BYTES tensors hold only these (`service.tensors.json`)
    try:
        return base64.b64decode("".join(element.split()), validate=True)
    except (binascii.Error, ValueError) as error:
        raise InputError(f"the string is not base64 ({error}); in JSON, send each image as "
                         "its base64 text, or send binary data") from None


def image_row(element: object, options: ImagePreprocess) -> tuple[np.ndarray, Geometry]:
    """One batch row from one BYTES element, and where the image's pixels landed in it."""
    return preprocess_image(image_bytes(element), options)


class ImageInputs:
    """Turns the BYTES tensors of a request into its model's input tensors, on a pool of
    `threads` threads (started on first use)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="images")
        return self._pool

    def close(self) -> None:
        """Stop the pool's threads (queued rows still finish)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    async def prepare(self, handle: LoadedVersion, arrays: Mapping[str, np.ndarray]
                      ) -> tuple[dict[str, np.ndarray], dict[str, list[Geometry]]]:
        """`arrays` with each BYTES tensor of a pipeline input replaced by its tensors (an
        image input's stacked rows; a text input's token ids, types and valid lengths), other
        tensors (including floats sent to a pipeline input) as they are; and each image
        input's geometries (one per row) for postprocessing.

        Raises:
            InputError: an image or text is refused; the message names the input and the row.
        """
        converted, geometries = dict(arrays), {}
        for name, options in handle.pipelines.items():
            array = arrays.get(name)
            if array is not None and array.dtype == object:
                where = f"model {handle.name!r} version {handle.version}: input {name!r}"
                if isinstance(options, TextPipeline):  # one job: tokenising holds the GIL
                    converted.update(await asyncio.get_running_loop().run_in_executor(
                        self._executor(), text_tensors, options, array, where))
                    continue
                converted[name], geometries[name] = await self._rows(array.reshape(-1), options,
                                                                     where)
        return converted, geometries

    async def _rows(self, elements: np.ndarray, options: ImagePreprocess,
                    where: str) -> tuple[np.ndarray, list[Geometry]]:
        loop = asyncio.get_running_loop()
        pool = self._executor()
        jobs = [loop.run_in_executor(pool, image_row, element, options) for element in elements]
        # Every row finishes before the answer: no thread keeps working for a refused request.
        rows = await asyncio.gather(*jobs, return_exceptions=True)
        for index, row in enumerate(rows):
            if isinstance(row, InputError):
                raise InputError(f"{where}, batch row {index}: {row}") from row
            if isinstance(row, BaseException):
                raise row
        return np.stack([row for row, _ in rows]), [geometry for _, geometry in rows]
