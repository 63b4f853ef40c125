"""The ``text`` kind of an input's ``preprocess``: strings to BERT's three inputs.

Pure data, validated when the config is parsed (unknown keys are errors)::

    {"name": "text", "source": "data0", "preprocess": {"text": {
        "vocab": "vocab.txt", "lower_case": true, "max_length": 128, "pairs": true,
        "token_types": "data1", "valid_length": "data2"}}}

The input it sits on takes the token ids; `token_types` and `valid_length` name the config's
other inputs that it fills (clients send only the text); `pairs` says that a row is two texts,
for model metadata (single texts are taken all the same). `engine.serving.text` runs it;
docs/preprocessing.md describes every key.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

# A vocabulary sits in a version's folder or beside config.json: a plain file name.
VOCAB_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_LENGTH = 8192  # tokens a row; BERT's own position table has 512


class TextPreprocess(BaseModel):
    """WordPiece tokenisation of one string (or a pair) a batch row, into token ids, token types
    and a valid length, as GluonNLP's ``BERTSentenceTransform`` makes them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab: str = "vocab.txt"
    lower_case: StrictBool = True
    strip_accents: StrictBool | None = None  # None: as lower_case (BERT's rule)
    max_length: StrictInt = Field(ge=3, le=MAX_LENGTH)
    padding: Literal["max_length", "longest"] = "max_length"
    pairs: StrictBool = False  # what model metadata shows: rows of two texts, [-1, 2]
    token_types: str | None = Field(None, min_length=1, max_length=256)
    valid_length: str | None = Field(None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _consistent(self) -> TextPreprocess:
        if not VOCAB_FILE.fullmatch(self.vocab):
            raise ValueError(f"vocab {self.vocab!r} must be a plain file name (letters, digits, "
                             "'.', '_', '-'; no folders)")
        if self.token_types is not None and self.token_types == self.valid_length:
            raise ValueError(f"token_types and valid_length both name input "
                             f"{self.token_types!r}; they fill two different inputs")
        return self

    @property
    def wire_shape(self) -> list[int]:
        """The shape model metadata shows for the texts: ``[-1]``, or ``[-1, 2]`` for pairs."""
        return [-1, 2] if self.pairs else [-1]

    @property
    def filled(self) -> tuple[str, ...]:
        """The names of the other inputs this pipeline fills."""
        return tuple(name for name in (self.token_types, self.valid_length) if name is not None)
