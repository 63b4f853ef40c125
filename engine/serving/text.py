"""Run an input's text pipeline: strings to token ids, token types and valid lengths.

One batch row is one text or a pair of texts. As GluonNLP's ``BERTSentenceTransform`` does:
``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``, token type 0 up to the first ``[SEP]`` and 1
after it, texts truncated to fit `max_length` (a pair longest first: a token comes off the
longer text, off the second when they are as long), then ``[PAD]`` up to the length the
batch's rows share. A pair whose second text has no tokens is encoded as one text, as
GluonNLP does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.errors import InputError
from engine.serving.text_config import TextPreprocess
from engine.serving.wordpiece import Vocabulary, WordPieceTokenizer


@dataclass(frozen=True)
class TextPipeline:
    """A text input's pipeline, ready to run: its options, tokeniser, the config names of the
    inputs it fills, their datatypes, and the length rows are padded to (None: the longest row
    of each request)."""

    options: TextPreprocess
    tokenizer: WordPieceTokenizer
    ids_input: str
    dtypes: dict[str, np.dtype]  # by input name: token ids, token types, valid length
    pad_to: int | None

    @classmethod
    def build(cls, options: TextPreprocess, vocab: Vocabulary, ids_input: str,
              dtypes: dict[str, np.dtype], fixed_length: int | None) -> TextPipeline:
        """The pipeline for the completed input `ids_input`; `fixed_length` is the sequence
        length its graph fixes, if any."""
        tokenizer = WordPieceTokenizer(vocab, lower_case=options.lower_case,
                                       strip_accents=options.strip_accents)
        pad_to = fixed_length or (options.max_length if options.padding == "max_length" else None)
        return cls(options, tokenizer, ids_input, dtypes, pad_to)

    def encode(self, rows: Sequence[Sequence[str]]) -> dict[str, np.ndarray]:
        """The filled inputs' tensors for `rows` (each one text or a pair), by input name."""
        encoded = [self.encode_row(texts) for texts in rows]
        width = self.pad_to or max(len(ids) for ids, _ in encoded)
        vocab = self.tokenizer.vocab
        ids = np.full((len(rows), width), vocab.id_of("[PAD]"), np.int64)
        types = np.zeros((len(rows), width), np.int64)
        for index, (row_ids, first) in enumerate(encoded):
            ids[index, :len(row_ids)] = row_ids
            types[index, first:len(row_ids)] = 1
        lengths = np.array([len(row_ids) for row_ids, _ in encoded], np.int64)
        arrays = {self.ids_input: ids, self.options.token_types: types,
                  self.options.valid_length: lengths}
        return {name: array.astype(self.dtypes[name]) for name, array in arrays.items()
                if name is not None}

    def encode_row(self, texts: Sequence[str]) -> tuple[list[int], int]:
        """One row's token ids with [CLS] and [SEP]s, and where its token type 1 starts (its
        length when it has one text)."""
        vocab, budget = self.tokenizer.vocab, self.options.max_length
        # Longest-first truncation only ever keeps a text's first `budget` tokens.
        first = self.tokenizer.ids(texts[0], budget)
        second = self.tokenizer.ids(texts[1], budget) if len(texts) > 1 else []
        cls, sep = vocab.id_of("[CLS]"), vocab.id_of("[SEP]")
        if not second:
            ids = [cls, *first[:budget - 2], sep]
            return ids, len(ids)
        while len(first) + len(second) > budget - 3:
            (first if len(first) > len(second) else second).pop()
        head = [cls, *first, sep]
        return [*head, *second, sep], len(head)


def text_rows(elements: Sequence[object], columns: int) -> list[tuple[str, ...]]:
    """A BYTES tensor's elements (row-major, `columns` a row) as texts: `str` as it is,
    `bytes` decoded as UTF-8.

    Raises:
        InputError: an element is not UTF-8; the message names its batch row.
    """
    texts = []
    for element in elements:
        if isinstance(element, bytes):
            try:
                element = element.decode("utf-8")
            except UnicodeDecodeError as error:
                row = len(texts) // columns
                raise InputError(f"batch row {row}: the text is not UTF-8 ({error})") from None
        texts.append(str(element))
    return [tuple(texts[start:start + columns]) for start in range(0, len(texts), columns)]
