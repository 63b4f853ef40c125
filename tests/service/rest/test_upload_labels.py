"""The ``labels`` parts of a model upload: kept under their file names in the staging folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import BadRequest, PayloadTooLarge
from service.rest.uploads import _UploadParser

BOUNDARY = b"xyzzy"


def _body(parts: list[tuple[str, str | None, bytes]]) -> bytes:
    chunks = []
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"' + (
            "" if filename is None else f'; filename="{filename}"')
        chunks.append(b"--" + BOUNDARY + b"\r\nContent-Disposition: " + disposition.encode()
                      + b"\r\n\r\n" + data + b"\r\n")
    return b"".join(chunks) + b"--" + BOUNDARY + b"--\r\n"


def _parse(staging: Path, *labels: tuple[str | None, bytes]) -> _UploadParser:
    parser = _UploadParser(BOUNDARY, staging)
    try:
        parser.feed(_body([("symbol", "s.json", b"{}"), ("params", "p.params", b"\0"),
                           *(("labels", filename, data) for filename, data in labels)]))
    finally:
        parser.close()  # as `receive_upload` does, whatever happened
    parser.form()
    return parser


def test_each_labels_part_is_kept_under_its_file_name(tmp_path: Path) -> None:
    parser = _parse(tmp_path, ("classes.txt", b"cat\ndog\n"), (r"C:\data\more.txt", b"a\n"),
                    (None, b"x\n"))
    assert parser.named_files == ["classes.txt", "more.txt", "labels.txt"]
    assert (tmp_path / "classes.txt").read_bytes() == b"cat\ndog\n"
    assert (tmp_path / "more.txt").read_bytes() == b"a\n"
    assert (tmp_path / "labels.txt").read_bytes() == b"x\n"


@pytest.mark.parametrize(("labels", "message"), [
    ((("a.txt", b"1"), ("dir/a.txt", b"2")), "two 'labels' parts are named 'a.txt'"),
    ((("model-symbol.json", b"1"),), "part 'labels' has file name 'model-symbol.json'"),
    ((("..", b"1"),), "part 'labels' has file name '..'"),
])
def test_labels_parts_that_would_clash_are_a_400(tmp_path: Path, labels: tuple,
                                                 message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        _parse(tmp_path, *labels)


def test_a_labels_part_has_a_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("service.rest.uploads.MAX_LABELS_BYTES", 8)
    with pytest.raises(PayloadTooLarge, match="part 'labels' \\(big.txt\\) exceeds its limit"):
        _parse(tmp_path, ("big.txt", b"0123456789"))
