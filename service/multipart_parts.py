"""The part headers of a multipart body, for python-multipart's push parser callbacks."""

from __future__ import annotations

from python_multipart.multipart import parse_options_header


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
