"""Multipart bodies, for python-multipart's push parser: each part's headers, and a body's parts.

`PartHeaders` collects the part headers of any push parser's callbacks (the model upload's
parser streams parts to disk: `service.rest.uploads`); `FormParts` keeps the parts of a body
already in memory by field name (images sent to ``/predict``: `service.tensors.images`).
"""

from __future__ import annotations

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from service.errors import BadRequest


class PartHeaders:
    """Collects each part's headers and keeps its ``Content-Disposition``; subclasses pass
    `_header_field`, `_header_value` and `_header_end` to the parser and read `part_name`."""

    def __init__(self) -> None:
        self._header = [bytearray(), bytearray()]
        self.disposition = b""

    def part_name(self) -> tuple[str, dict[bytes, bytes]]:
        """(the current part's field name, its disposition options)."""
        _, options = parse_options_header(self.disposition)
        return options.get(b"name", b"").decode("utf-8", errors="replace"), options

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header[0] += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._header[1] += data[start:end]

    def _header_end(self) -> None:
        if bytes(self._header[0]).lower() == b"content-disposition":
            self.disposition = bytes(self._header[1])
        self._header = [bytearray(), bytearray()]


class FormParts(PartHeaders):
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
