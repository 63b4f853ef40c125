"""Model uploads over HTTP: the multipart body streamed into a staging directory.

The model files go straight from the socket to ``REPO/.tmp-*/`` (the directory the repository
then validates and renames into place: `service.dataplane.repository.upload`, which also bounds
how many uploads run at once), a megabyte at a time, parsed and written by a worker thread: no
part is ever held whole in memory, and the event loop only hands bytes over.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request

from engine.serving.config import CALIBRATION_NAME, LABELS_FILE, RESERVED_FILES
from engine.serving.labels import MAX_LABELS_BYTES
from engine.serving.manifest import PARAMS_NAME, SYMBOL_NAME
from engine.serving.wordpiece import MAX_VOCAB_BYTES
from service.dataplane.repository import UploadForm
from service.errors import BadRequest, PayloadTooLarge
from service.tensors.multipart import PartHeaders

FILE_PARTS = {"symbol": SYMBOL_NAME, "params": PARAMS_NAME}
# Optional file parts: an int8 model's calibration inputs (`engine.serving.calibration`).
OPTIONAL_FILE_PARTS = {"calibration": CALIBRATION_NAME}
STORED_PARTS = {**FILE_PARTS, **OPTIONAL_FILE_PARTS}
LABELS_PART = "labels"  # may repeat: one per labels file config.json names
DEFAULT_LABELS_NAME = "labels.txt"
VOCAB_PART = "vocab"  # may repeat: one per vocabulary file config.json names
# Parts kept as files under their own file names, and the name a part without one gets.
NAMED_FILE_PARTS = {LABELS_PART: DEFAULT_LABELS_NAME, VOCAB_PART: "vocab.txt"}
FIELD_LIMITS = {"config": 1 << 20, "version": 64, "replace": 16}
HANDOFF_BYTES = 1 << 20  # body bytes gathered on the event loop per hand-off to the parser
TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off", "")
EXPECTED = ("parts symbol and params (files), and optionally config (file), labels, vocab "
            "and calibration (files), version, replace")


async def receive_upload(request: Request, staging: Path) -> UploadForm:
    """Stream `request`'s multipart body into `staging`: ``symbol`` and ``params`` become its
    model files, each ``labels`` or ``vocab`` part a file under the part's file name (which
    config.json names; ``labels.txt`` or ``vocab.txt`` when the part has none); ``config``,
    ``version`` and ``replace`` are kept (they are small).

    Raises:
        BadRequest: not multipart, malformed, or a part missing, unknown or repeated.
        PayloadTooLarge: a small field over its limit (the body's own limit is `BodyLimit`'s).
    """
    parser = _UploadParser(_boundary(request.headers.get("content-type", "")), staging)
    pending = bytearray()
    try:
        async for chunk in request.stream():
            pending += chunk
            if len(pending) >= HANDOFF_BYTES:
                await run_in_threadpool(parser.feed, bytes(pending))
                pending.clear()
        await run_in_threadpool(parser.feed, bytes(pending))
    except ClientDisconnect:
        # Nobody reads the answer; a 4xx keeps the log free of a 500's traceback.
        raise BadRequest("the client disconnected before the upload was complete") from None
    finally:
        await run_in_threadpool(parser.close)
    return parser.form()


def _boundary(content_type: str) -> bytes:
    kind, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise BadRequest(f"a model upload must be multipart/form-data with the {EXPECTED}; got "
                         f"Content-Type {content_type or '(none)'!r}")
    return boundary


class _UploadParser(PartHeaders):
    """python-multipart's push parser, with callbacks writing file parts to `staging`."""

    def __init__(self, boundary: bytes, staging: Path) -> None:
        super().__init__()
        self.staging = staging
        self.fields: dict[str, bytearray] = {}
        self.seen: set[str] = set()
        self.finished = False
        self._name = ""
        self._file: BinaryIO | None = None
        self._file_bytes = 0
        self.named_files: list[str] = []  # the labels and vocab files kept
        try:
            self._parser = MultipartParser(boundary, {
                "on_part_begin": self._part_begin, "on_header_field": self._header_field,
                "on_header_value": self._header_value, "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
                "on_part_end": self._part_end, "on_end": self._end})
        except ValueError as error:
            raise BadRequest(f"a model upload must be multipart/form-data: {error}") from None

    def feed(self, data: bytes) -> None:
        """Parse the next bytes of the body (on a worker thread: this writes files)."""
        try:
            self._parser.write(data)
        except MultipartParseError as error:
            raise BadRequest(f"malformed multipart body: {error}") from None

    def close(self) -> None:
        """Close the file being written, if the body stopped inside it."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def form(self) -> UploadForm:
        """The fields, once the whole body is parsed and every required part was present."""
        if not self.finished:
            raise BadRequest("the multipart body ended before its closing boundary")
        for name, file_name in FILE_PARTS.items():
            if name not in self.seen:
                raise BadRequest(f"missing part {name!r} ({file_name}); an upload has the "
                                 f"{EXPECTED}")
        text = {name: bytes(value).decode("utf-8", errors="replace").strip()
                for name, value in self.fields.items() if name != "config"}
        replace = text.get("replace", "").lower()
        if replace not in TRUE_WORDS + FALSE_WORDS:
            raise BadRequest(f"part 'replace' must be true or false, got {text['replace']!r}")
        config = self.fields.get("config")
        return UploadForm(None if config is None else bytes(config), text.get("version") or None,
                          replace in TRUE_WORDS)

    # ----- python-multipart callbacks ----------------------------------------------------------

    def _part_begin(self) -> None:
        self.disposition = b""

    def _headers_finished(self) -> None:
        name, options = self.part_name()
        self._file_bytes = 0
        if name in NAMED_FILE_PARTS:
            self._name = name
            self._file = open(self.staging / self._file_name(name, options), "xb")  # noqa: SIM115
            return
        if name not in STORED_PARTS and name not in FIELD_LIMITS:
            raise BadRequest(f"unknown part {name!r} in the upload; expected the {EXPECTED}")
        if name in self.seen:
            raise BadRequest(f"part {name!r} appears more than once in the upload")
        self.seen.add(name)
        self._name = name
        if name in STORED_PARTS:
            self._file = open(self.staging / STORED_PARTS[name], "xb")  # noqa: SIM115 - closed at part end
        else:
            self.fields[name] = bytearray()

    def _file_name(self, part: str, options: dict[bytes, bytes]) -> str:
        """The file name a ``labels`` or ``vocab`` part is kept under: its own, checked to be a
        plain name that no other part of the upload took."""
        raw = options.get(b"filename")
        # Browsers and curl send a file's name; some clients send its path.
        name = (raw.decode("utf-8", errors="replace").replace("\\", "/").rsplit("/", 1)[-1]
                if raw else NAMED_FILE_PARTS[part])
        if not LABELS_FILE.fullmatch(name) or name in RESERVED_FILES:
            names = "output's labels" if part == LABELS_PART else "text pipeline's vocab"
            raise BadRequest(f"part {part!r} has file name {name!r}; it must be the plain file "
                             f"name config.json gives as the {names} (letters, digits, "
                             f"'.', '_', '-'), not one of {sorted(RESERVED_FILES)}")
        if name in self.named_files:
            raise BadRequest(f"two {part!r} parts are named {name!r}; give each file once")
        self.named_files.append(name)
        return name

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._file is not None:
            self._file_bytes += end - start
            limit = {LABELS_PART: MAX_LABELS_BYTES, VOCAB_PART: MAX_VOCAB_BYTES}.get(self._name)
            if limit is not None and self._file_bytes > limit:
                raise PayloadTooLarge(f"part {self._name!r} ({self.named_files[-1]}) exceeds its "
                                      f"limit of {limit} bytes")
            self._file.write(memoryview(data)[start:end])
            return
        field = self.fields[self._name]
        field += data[start:end]
        if len(field) > FIELD_LIMITS[self._name]:
            raise PayloadTooLarge(f"part {self._name!r} of the upload exceeds its limit of "
                                  f"{FIELD_LIMITS[self._name]} bytes")

    def _part_end(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())  # durable before the manifest names it
            self.close()

    def _end(self) -> None:
        self.finished = True
