"""The ``vocab`` parts of a model upload: kept under their file names beside the labels."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import BadRequest, PayloadTooLarge
from service.rest.uploads import _UploadParser
from tests.service.rest.test_upload_labels import BOUNDARY, _body


def _parse(staging: Path, *parts: tuple[str, str | None, bytes]) -> _UploadParser:
    parser = _UploadParser(BOUNDARY, staging)
    try:
        parser.feed(_body([("symbol", "s.json", b"{}"), ("params", "p.params", b"\0"),
                           *parts]))
    finally:
        parser.close()
    parser.form()
    return parser


def test_vocab_parts_are_kept_under_their_file_names(tmp_path: Path) -> None:
    parser = _parse(tmp_path, ("vocab", None, b"[PAD]\n"), ("vocab", "cased.txt", b"[CLS]\n"),
                    ("labels", "classes.txt", b"a\n"))
    assert parser.named_files == ["vocab.txt", "cased.txt", "classes.txt"]
    assert (tmp_path / "vocab.txt").read_bytes() == b"[PAD]\n"
    assert (tmp_path / "cased.txt").read_bytes() == b"[CLS]\n"


@pytest.mark.parametrize("parts, message", [
    ((("vocab", "v.txt", b"1"), ("labels", "v.txt", b"2")), "two 'labels' parts are named "
     "'v.txt'"),
    ((("vocab", "model-0000.params", b"1"),), "part 'vocab' has file name 'model-0000.params'"),
    ((("vocab", "..", b"1"),), "the text pipeline's vocab"),
])
def test_bad_vocab_parts_are_refused(tmp_path: Path, parts: tuple, message: str) -> None:
    with pytest.raises(BadRequest, match=message.replace("(", "\\(").replace(")", "\\)")):
        _parse(tmp_path, *parts)


def test_a_vocab_part_has_a_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("service.rest.uploads.MAX_VOCAB_BYTES", 8)
    with pytest.raises(PayloadTooLarge, match="part 'vocab' \\(big.txt\\) exceeds its limit"):
        _parse(tmp_path, ("vocab", "big.txt", b"0123456789"))
