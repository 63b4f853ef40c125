"""The WordPiece tokeniser and the text pipeline against GluonNLP 0.10.0's own encodings
(tests/fixtures/wordpiece, written by tools/mxnet_fixtures/generate_wordpiece.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import InputError
from engine.serving.text import TextPipeline, text_rows
from engine.serving.text_config import TextPreprocess
from engine.serving.wordpiece import Vocabulary, VocabularyError, WordPieceTokenizer

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "wordpiece"
CASES: list[dict[str, Any]] = json.loads((FIXTURE / "cases.json").read_text(encoding="utf-8"))
VOCAB = Vocabulary.read(FIXTURE / "vocab.txt")
INT32 = np.dtype(np.int32)


def _tokenizer(case: dict[str, Any]) -> WordPieceTokenizer:
    return WordPieceTokenizer(VOCAB, lower_case=case["lower_case"],
                              strip_accents=case["strip_accents"])


def _pipeline(case: dict[str, Any], padding: str = "max_length") -> TextPipeline:
    options = TextPreprocess(max_length=case["max_length"], lower_case=case["lower_case"],
                             strip_accents=case["strip_accents"], padding=padding,
                             token_types="types", valid_length="length")
    dtypes = {"ids": INT32, "types": INT32, "length": INT32}
    return TextPipeline.build(options, VOCAB, "ids", dtypes, None)


@pytest.mark.parametrize("case", CASES, ids=lambda case: repr(case["texts"])[:40])
def test_word_pieces_are_gluonnlps(case: dict[str, Any]) -> None:
    tokenizer = _tokenizer(case)
    assert [tokenizer.pieces(text) for text in case["texts"]] == case["pieces"]


@pytest.mark.parametrize("case", CASES, ids=lambda case: repr(case["texts"])[:40])
def test_ids_types_and_valid_length_are_bert_sentence_transforms(case: dict[str, Any]) -> None:
    encoded = _pipeline(case).encode([case["texts"]])
    assert encoded["ids"].tolist() == [case["ids"]]
    assert encoded["types"].tolist() == [case["types"]]
    assert encoded["length"].tolist() == [case["valid_length"]]
    assert {array.dtype for array in encoded.values()} == {INT32}


def test_a_batch_pads_to_its_longest_row_with_longest_padding() -> None:
    singles = [case for case in CASES if len(case["texts"]) == 1 and case["lower_case"]
               and case["max_length"] == 16]
    encoded = _pipeline(singles[0], "longest").encode([case["texts"] for case in singles])
    longest = max(case["valid_length"] for case in singles)
    assert encoded["ids"].shape == (len(singles), longest)
    for row, case in enumerate(singles):
        assert encoded["ids"][row].tolist() == case["ids"][:longest]
        assert encoded["length"][row] == case["valid_length"]


def test_accents_are_kept_when_cased_unless_stripping_is_asked_for() -> None:
    vocab = Vocabulary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "Café", "Cafe"])
    assert WordPieceTokenizer(vocab, lower_case=False).pieces("Café") == ["Café"]
    assert WordPieceTokenizer(vocab, lower_case=False, strip_accents=True).pieces(
        "Café") == ["Cafe"]
    assert WordPieceTokenizer(vocab, lower_case=True).pieces("CAFÉ") == ["[UNK]"]


def test_long_words_and_limits() -> None:
    tokenizer = WordPieceTokenizer(VOCAB)
    assert tokenizer.pieces("the" * 70) == ["[UNK]"]  # over 200 characters
    assert tokenizer.pieces("unable unx") == ["un", "##able", "[UNK]"]  # no ##x: all [UNK]
    assert tokenizer.ids("the cat " * 1000, limit=5) == tokenizer.ids("the cat the cat the")
    assert len(tokenizer.ids("the cat " * 1000)) == 2000


def test_vocabulary_files_that_cannot_serve_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "vocab.txt"
    for content, message in [(b"[PAD]\n[UNK]\n[CLS]\n", "lacks the special token\\(s\\) \\[SEP\\]"),
                             (b"[PAD]\n\n[UNK]\n", "line 2 is empty"),
                             (b"", "line 1 is empty"),
                             (b"[PAD]\xff\n", "not UTF-8")]:
        path.write_bytes(content)
        with pytest.raises(VocabularyError, match=message):
            Vocabulary.read(path)
    path.write_bytes(b"[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\nthe\r\n")
    assert WordPieceTokenizer(Vocabulary.read(path)).ids("The") == [4]


def test_text_rows_decode_utf8_and_name_the_bad_row() -> None:
    assert text_rows(["a", b"b", "c", b"d"], 2) == [("a", "b"), ("c", "d")]
    with pytest.raises(InputError, match="batch row 1: the text is not UTF-8"):
        text_rows([b"ok", b"\xff\xfe"], 1)


def test_options_are_validated_when_parsed() -> None:
    with pytest.raises(ValueError, match="lowercase"):
        TextPreprocess.model_validate({"max_length": 8, "lowercase": True})
    with pytest.raises(ValueError, match="plain file name"):
        TextPreprocess(max_length=8, vocab="../vocab.txt")
    with pytest.raises(ValueError, match="both name input 'x'"):
        TextPreprocess(max_length=8, token_types="x", valid_length="x")
    with pytest.raises(ValueError, match="max_length"):
        TextPreprocess(max_length=2)
    with pytest.raises(ValueError, match="max_length"):
        TextPreprocess.model_validate({})


@pytest.mark.parametrize("lower_case", [True, False])
def test_the_first_words_of_a_long_text_are_those_of_the_whole_text(lower_case: bool) -> None:
    rng = np.random.default_rng(5)
    pieces = ["the", "ΟΔΟΣ", "Σ.", "cafe\u0301", "中国", "un-believable", "\u200b", "!!",
              "\x00", "x" * 250, "ὈΔΥΣΣΕΎΣ", "\u00a0", "\t", "\r\n", " ", "  "]
    text = "".join(rng.choice(pieces, 12_000))
    tokenizer = WordPieceTokenizer(VOCAB, lower_case=lower_case)
    everything, ids = tokenizer.words(text), tokenizer.ids(text)
    assert len(text) > 100_000 and len(everything) > 5000, (len(text), len(everything))
    for limit in (1, 7, 3000, 5000, len(everything) + 10):
        assert tokenizer.words(text, limit) == everything[:limit]
        assert tokenizer.ids(text, limit) == ids[:limit]


def test_a_long_text_is_never_cut_inside_a_word() -> None:
    tokenizer = WordPieceTokenizer(VOCAB)
    text = "a " * 8191 + "unbelievable" + " dog" * 10  # the first cut, 16384, is inside it
    assert tokenizer.words(text, 8192)[-1] == "unbelievable"
    assert tokenizer.ids(text, 8194)[-3:] == tokenizer.ids("unbelievable")
