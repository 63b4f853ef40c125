"""HTTP content codings: gzip and deflate request bodies inflated as they arrive, and responses
compressed for clients whose Accept-Encoding asks for it.

tritonclient.http sends ``Content-Encoding: gzip`` (`gzip.compress`) or ``deflate`` (zlib's
format, as RFC 9110 defines it) when ``request_compression_algorithm`` is set, and asks for
either with ``response_compression_algorithm``. Raw deflate streams, which some clients send
for ``deflate``, are told apart from zlib's by its two-byte header.
"""

from __future__ import annotations

import zlib

from service.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType

CODINGS = ("gzip", "deflate")
IDENTITY = "identity"
# Below this a compressed body saves less than a packet, and costs a compression each time.
MIN_COMPRESS_BYTES = 1024
# Level 1: a few times faster than zlib's default, most of its gain on numeric JSON.
LEVEL = 1
WBITS = {"gzip": 31, "deflate": 15}
RAW_DEFLATE = -15


class BodyDecoder:
    """Inflates one request body chunk by chunk, refusing it (413) as soon as the inflated
    bytes pass `limit`: memory stays within the limit however far the body would expand."""

    def __init__(self, coding: str, limit: int, too_large: str) -> None:
        self.coding = coding
        self.limit = limit
        self.too_large = too_large
        self.produced = 0
        self._inflater: zlib._Decompress | None = None
        self._head = b""

    def feed(self, chunk: bytes) -> bytes:
        """The inflated bytes of the next `chunk` of the body."""
        if self._inflater is None:
            self._head += chunk
            if len(self._head) < 2:
                return b""
            chunk, self._head = self._head, b""
            self._inflater = zlib.decompressobj(self._wbits(chunk))
        pieces = []
        data = chunk
        while data:
            try:
                out = self._inflater.decompress(data, self.limit - self.produced + 1)
            except zlib.error as error:
                raise BadRequest(f"the request body is not valid {self.coding} data "
                                 f"(Content-Encoding: {self.coding}): {error}") from None
            self.produced += len(out)
            if self.produced > self.limit:
                raise PayloadTooLarge(self.too_large + " once decompressed")
            pieces.append(out)
            if self._inflater.unused_data:
                raise BadRequest(f"the request body has data after the end of its "
                                 f"{self.coding} stream")
            data = self._inflater.unconsumed_tail
        return b"".join(pieces)

    def finish(self) -> None:
        """400 when the body ended before its compressed stream did."""
        if self._head or (self._inflater is not None and not self._inflater.eof):
            raise BadRequest(f"the request body ends before its {self.coding} stream does "
                             "(truncated?)")

    def _wbits(self, head: bytes) -> int:
        if self.coding == "deflate" and not _zlib_header(head):
            return RAW_DEFLATE
        return WBITS[self.coding]


def _zlib_header(head: bytes) -> bool:
    """Whether `head` starts with a zlib header (deflate method, checksum of the two bytes)."""
    return head[0] & 0x0F == 8 and ((head[0] << 8) | head[1]) % 31 == 0


def body_decoder(content_encoding: bytes | None, limit: int, too_large: str
                 ) -> BodyDecoder | None:
    """The decoder a Content-Encoding header calls for; None for none (or identity); 415
    naming the coding when it is one this server does not read."""
    if content_encoding is None:
        return None
    coding = content_encoding.decode("latin-1").strip().lower()
    if coding in ("", IDENTITY):
        return None
    if coding not in CODINGS:
        raise UnsupportedMediaType(f"Content-Encoding {coding!r:.60} is not supported; send "
                                   f"the body as {', '.join(CODINGS)} or uncompressed")
    return BodyDecoder(coding, limit, too_large)


def accepted_coding(accept_encoding: bytes | None) -> str | None:
    """The coding to compress a response with: gzip or deflate, whichever Accept-Encoding
    weighs more (gzip on a tie, ``*`` counting as gzip), or None."""
    if not accept_encoding:
        return None
    weights: dict[str, float] = {}
    for item in accept_encoding.decode("latin-1").lower().split(","):
        name, _, parameters = item.partition(";")
        weights[name.strip()] = _quality(parameters)
    best, weight = None, 0.0
    for coding in CODINGS:
        quality = weights.get(coding, weights.get("*", 0.0))
        if quality > weight:
            best, weight = coding, quality
    return best


def _quality(parameters: str) -> float:
    for parameter in parameters.split(";"):
        key, _, value = parameter.partition("=")
        if key.strip() == "q":
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 1.0


def compress(body: bytes, coding: str) -> bytes:
    """`body` compressed with `coding` (gzip or deflate)."""
    compressor = zlib.compressobj(LEVEL, zlib.DEFLATED, WBITS[coding])
    return compressor.compress(body) + compressor.flush()
