"""``POST /predict`` with images: a raw ``image/*`` body, or multipart files, to BYTES tensors.

A raw body is one image for the model's one pipeline input; the model (and optionally the
version) is named in the query string, ``/predict?model=resnet&version=2``. A
``multipart/form-data`` body holds one part per image, named after its input: several parts of
one name are several batch rows, in order. The whole body is already in memory (bounded by
``max_request_bytes``), so the parts are parsed from it in one pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs

import numpy as np
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from service.errors import BadRequest
from service.multipart_parts import PartHeaders

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
    return ImageRequest(model, version, _FormParts(boundary).parse(body))


def as_tensors(images: Mapping[str, list[bytes]]) -> dict[str, np.ndarray]:
    """Each input's images as a BYTES tensor of shape ``[N]``."""
    tensors = {}
    for name, parts in images.items():
        tensor = np.empty(len(parts), dtype=object)
        tensor[:] = parts
        tensors[name] = tensor
    return tensors


class _FormParts(PartHeaders):
    """python-multipart's push parser, collecting each part's bytes under its field name."""

    def __init__(self, boundary: bytes) -> None:
        super().__init__()
        self.parts: dict[str, list[bytes]] = {}
        self.finished = False
        self._data = bytearray()
        try:
            self._parser = MultipartParser(boundary, {
                "on_header_field": self._header_field, "on_header_value": self._header_value,
                "on_header_end": self._header_end, "on_part_data": self._part_data,
                "on_part_end": self._part_end, "on_end": self._end})
        except ValueError as error:
            raise BadRequest(f"multipart body cannot be read: {error}") from None

    def parse(self, body: bytes) -> dict[str, list[bytes]]:
        """Every part of `body`, by name, in order."""
        try:
            self._parser.write(body)
            self._parser.finalize()
        except MultipartParseError as error:
            raise BadRequest(f"malformed multipart body: {error}") from None
        if not self.finished:
            raise BadRequest("the multipart body ended before its closing boundary")
        if not self.parts:
            raise BadRequest("the multipart body has no parts; send one file per image, "
                             "named after its input")
        return self.parts

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        self._data += data[start:end]

    def _part_end(self) -> None:
        name, _ = self.part_name()
        if not name:
            raise BadRequest("a multipart part has no name; name each image part after its "
                             "input (Content-Disposition: form-data; name=\"INPUT\")")
        self.parts.setdefault(name, []).append(bytes(self._data))
        self.disposition, self._data = b"", bytearray()

    def _end(self) -> None:
        self.finished = True
