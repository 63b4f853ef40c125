"""Reference WordPiece encodings from GluonNLP 0.10.0, for the server's own tokeniser.

Writes ``OUT/vocab.txt`` (50 tokens, the vocabulary size of the ``gluonnlp_bert_tiny`` fixture:
BERT's special tokens and real English word pieces) and ``OUT/cases.json``: for each case, the
texts (one, or a pair), the tokeniser options, GluonNLP's ``BERTTokenizer`` word pieces and
``BERTSentenceTransform``'s token ids, token types and valid length (padded to ``max_length``).

    /tmp/mxvenv/bin/python tools/mxnet_fixtures/generate_wordpiece.py --out tests/fixtures/wordpiece
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gluonnlp as nlp

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PIECES = [
    ".", ",", "!", "?", "'", "-", "the", "a", "is", "cat", "dog", "sat", "on", "mat", "it",
    "play", "##ing", "##s", "##ed", "un", "##believ", "##able", "hello", "world", "cafe",
    "naive", "do", "you", "like", "this", "i", "run", "##n", "##er", "big", "##ly", "Hello",
    "中", "国", "人", "日", "本", "token", "##ize", "##r",
]
VOCAB = SPECIAL + PIECES  # line N is token id N

# (texts, lower_case, strip_accents, max_length): gluonnlp strips accents whatever `lower`
# says, so its cased cases reproduce the server's "strip_accents": true.
CASES = [
    (["the cat sat on the mat."], True, True, 16),
    (["Hello, World!  Do you like THIS?"], True, True, 16),
    (["Hello, World!  Do you like THIS?"], False, True, 16),
    (["Café naïve — unbelievable!"], True, True, 16),
    (["中国人 like 日本"], True, True, 16),
    (["tokenizer tokenizers playing played runner"], True, True, 16),
    (["xylophone zebra qqq the"], True, True, 16),
    (["the\tcat\nsat\r\non\u00a0the\u200bmat\x00!\ufffd\x07dog\u3000it"], True, True, 16),
    (["Café Naïve"], False, True, 8),
    (["the dog " * 12], True, True, 16),
    ([""], True, True, 8),
    (["the cat", "sat on the mat"], True, True, 16),
    (["is it a big dog?", "it is a big cat!"], True, True, 16),
    (["the cat " * 10, "a dog"], True, True, 12),
    (["a dog", "the cat " * 10], True, True, 12),
    (["the cat " * 10, "the dog " * 10], True, True, 13),
    (["Hello", ""], True, True, 8),
    (["unbelievable unbelievably", "Hello hello HELLO"], False, True, 16),
]


def encode(texts: list[str], lower: bool, max_length: int) -> dict[str, object]:
    vocab = nlp.vocab.BERTVocab(token_to_idx={token: index for index, token in enumerate(VOCAB)},
                                counter=dict.fromkeys(VOCAB, 1))
    tokenizer = nlp.data.BERTTokenizer(vocab, lower=lower)
    transform = nlp.data.BERTSentenceTransform(tokenizer, max_length, pad=True,
                                               pair=len(texts) == 2)
    ids, valid_length, types = transform(tuple(texts))
    assert [vocab.idx_to_token[index] for index in range(len(VOCAB))] == VOCAB
    return {"pieces": [tokenizer(text) for text in texts], "ids": ids.tolist(),
            "types": types.tolist(), "valid_length": int(valid_length)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.txt").write_text("".join(token + "\n" for token in VOCAB), encoding="utf-8")
    cases = [{"texts": texts, "lower_case": lower, "strip_accents": strip,
              "max_length": max_length, **encode(texts, lower, max_length)}
             for texts, lower, strip, max_length in CASES]
    (out / "cases.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n",
                                    encoding="utf-8")
    print(f"{len(cases)} cases, {len(VOCAB)} tokens -> {out}")


if __name__ == "__main__":
    main()
