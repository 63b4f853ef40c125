"""BERT's WordPiece tokeniser: basic tokenisation, then greedy longest-match-first word pieces.

Basic tokenisation as BERT (and GluonNLP 0.10's ``BERTTokenizer``) does it: control characters,
NUL and U+FFFD dropped, whitespace normalised, every CJK ideograph a word of its own; then
optionally lower case, and with ``strip_accents`` NFD normalisation and the combining marks
(category Mn) dropped; then every punctuation character (Unicode ``P*`` and all non-alphanumeric
printable ASCII) a word of its own. Each word becomes the longest vocabulary entry that starts
it, then the longest ``##``-prefixed entry that continues it, and so on; a word with a part no
entry matches, or of more than 200 characters, is ``[UNK]``.

The per-character rules run as `str.translate` tables, which compute each distinct character's
replacement once, so a request's text is scanned in C.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping
from pathlib import Path

CONTINUATION = "##"
MAX_WORD_CHARS = 200  # as Google's BERT and GluonNLP: longer words are [UNK] whole
SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[UNK]", "[PAD]")
MAX_VOCAB_BYTES = 16 << 20
_CACHE_WORDS = 1 << 16  # words remembered per tokeniser (their pieces' ids)
_PREFIX_CHARS = 1 << 14  # the first cut of a long text when only its first words are needed
_WHITESPACE = re.compile(r"[ \t\n\r]")
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


class VocabularyError(ValueError):
    """A vocab.txt that cannot serve: unreadable, not UTF-8, empty, or a token missing."""


def _is_cjk(code: int) -> bool:
    return any(low <= code <= high for low, high in _CJK_RANGES)


def _is_punctuation(char: str) -> bool:
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


class _CleanTable(dict[int, str]):
    """`str.translate` table of the first pass: drop control characters, NUL and U+FFFD, turn
    whitespace into a space, surround CJK ideographs with spaces."""

    def __missing__(self, code: int) -> str:
        char = chr(code)
        category = unicodedata.category(char)
        if char in " \t\n\r" or category == "Zs":
            replacement = " "
        elif code in (0, 0xFFFD) or category in ("Cc", "Cf"):
            replacement = ""
        elif _is_cjk(code):
            replacement = f" {char} "
        else:
            replacement = char
        self[code] = replacement
        return replacement


class _SplitTable(dict[int, str]):
    """`str.translate` table of the second pass: surround punctuation with spaces and, when
    stripping accents, drop combining marks."""

    def __init__(self, strip_accents: bool) -> None:
        super().__init__()
        self.strip_accents = strip_accents

    def __missing__(self, code: int) -> str:
        char = chr(code)
        if self.strip_accents and unicodedata.category(char) == "Mn":
            replacement = ""
        elif _is_punctuation(char):
            replacement = f" {char} "
        else:
            replacement = char
        self[code] = replacement
        return replacement


class Vocabulary:
    """A ``vocab.txt``: one token a line, line N (from 0) being token id N."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        # A token listed twice keeps its last line's id, as BERT's own vocabulary loader does.
        self.ids = {token: index for index, token in enumerate(tokens)}
        missing = [token for token in SPECIAL_TOKENS if token not in self.ids]
        if missing:
            raise VocabularyError(f"it lacks the special token(s) {', '.join(missing)}; a BERT "
                                  f"vocabulary has {', '.join(SPECIAL_TOKENS)}")
        # No piece is longer than the longest entry: the longest match never looks further.
        self.longest = max(len(token.removeprefix(CONTINUATION)) for token in tokens)

    @classmethod
    def read(cls, path: Path) -> Vocabulary:
        """The vocabulary in `path`.

        Raises:
            VocabularyError: the file is too large, not UTF-8, or lacks a special token.
            OSError: it cannot be read.
        """
        if path.stat().st_size > MAX_VOCAB_BYTES:
            raise VocabularyError(f"it is over {MAX_VOCAB_BYTES} bytes")
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as error:
            raise VocabularyError(f"it is not UTF-8 text: {error}") from None
        # A final newline ends the last token; "\r\n" files are read as written on Windows.
        tokens = [line.rstrip("\r") for line in text.removesuffix("\n").split("\n")]
        if not text or any(token == "" for token in tokens):
            empty = tokens.index("") + 1 if text else 1
            raise VocabularyError(f"line {empty} is empty; a vocabulary has one token a line")
        return cls(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def id_of(self, token: str) -> int:
        """The id of a special token (present: checked on construction)."""
        return self.ids[token]


class WordPieceTokenizer:
    """Text to token ids with a `Vocabulary`; safe to share between threads."""

    def __init__(self, vocab: Vocabulary, *, lower_case: bool = True,
                 strip_accents: bool | None = None) -> None:
        self.vocab = vocab
        self.lower_case = lower_case
        self.strip_accents = lower_case if strip_accents is None else strip_accents
        self._clean = _CleanTable()
        self._split = _SplitTable(self.strip_accents)
        self._unknown = (vocab.id_of("[UNK]"),)
        self._words: dict[str, tuple[int, ...]] = {}

    def words(self, text: str, limit: int | None = None) -> list[str]:
        """Basic tokenisation: the words of `text` (at most its first `limit`), before word
        pieces."""
        if limit is not None:
            # A long text needs only its beginning. Cut at whitespace, every step of which
            # (case, NFD, splitting) ends there: the cut's words begin the whole text's words.
            size = _PREFIX_CHARS
            while size < len(text):
                cut = _WHITESPACE.search(text, size)
                if cut is None:
                    break
                words = self._basic(text[:cut.start()]).split(None, limit)
                if len(words) >= limit:
                    return words[:limit]
                size *= 4
            return self._basic(text).split(None, limit)[:limit]
        return self._basic(text).split()

    def _basic(self, text: str) -> str:
        """`text` cleaned, cased and split by spaces around punctuation and CJK ideographs."""
        text = text.translate(self._clean)
        if self.lower_case:
            text = text.lower()
        if self.strip_accents and not text.isascii():
            text = unicodedata.normalize("NFD", text)
        return text.translate(self._split)

    def ids(self, text: str, limit: int | None = None) -> list[int]:
        """The token ids of `text` (no [CLS] or [SEP]); with `limit`, at most its first `limit`
        (the rest of the text is not split into pieces)."""
        ids: list[int] = []
        # Every word gives at least one piece: words past the first `limit` are never needed.
        for word in self.words(text, limit):
            pieces = self._words.get(word)
            if pieces is None:
                pieces = self._word_ids(word)
                if len(self._words) >= _CACHE_WORDS:
                    self._words.clear()  # a bounded memory, not an LRU: words repeat a lot
                self._words[word] = pieces
            ids.extend(pieces)
            if limit is not None and len(ids) >= limit:
                return ids[:limit]
        return ids

    def pieces(self, text: str) -> list[str]:
        """The word pieces of `text`, as strings (for tests and debugging)."""
        return [self.vocab.tokens[index] for index in self.ids(text)]

    def _word_ids(self, word: str) -> tuple[int, ...]:
        """Greedy longest-match-first: the ids of one word's pieces, or of [UNK]."""
        if len(word) > MAX_WORD_CHARS:
            return self._unknown
        vocab, found = self.vocab.ids, []
        start = 0
        while start < len(word):
            match = next(_longest_match(vocab, word, start, self.vocab.longest), None)
            if match is None:
                return self._unknown
            start, index = match
            found.append(index)
        return tuple(found)


def _longest_match(vocab: Mapping[str, int], word: str, start: int,
                   longest: int) -> Iterator[tuple[int, int]]:
    """(end, id) of the longest entry matching `word` from `start`, if any: ``##``-prefixed
    past the first piece."""
    prefix = CONTINUATION if start > 0 else ""
    for end in range(min(len(word), start + longest), start, -1):
        index = vocab.get(prefix + word[start:end])
        if index is not None:
            yield end, index
            return
