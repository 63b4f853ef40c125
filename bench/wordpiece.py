"""Benchmark: the server's WordPiece tokeniser against Hugging Face ``tokenizers`` (Rust).

Usage: ``python bench/wordpiece.py [--hf-path DIR]``, where DIR holds ``tokenizers`` (it is not
a project dependency: ``pip install --target DIR tokenizers==0.23.3``); without it only ours is
timed. A BERT-sized vocabulary (30,000 entries: the corpus's most frequent words, then ``##``
suffixes and single characters) and the sentences are built from the English comments and
docstrings of Python's standard library, so that nothing is downloaded. Prints sentences/s and
tokens/s on one thread (run with ``RAYON_NUM_THREADS=1``; the best of 5 passes over the corpus;
ours with its word cache kept, and cleared before each sentence), and how many sentences the two
tokenise differently.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.serving.wordpiece import SPECIAL_TOKENS, Vocabulary, WordPieceTokenizer  # noqa: E402

VOCAB_SIZE = 30_000
SENTENCES = 20_000
COMMENT = re.compile(r"#\s*(.{30,})|^\s{4,}([A-Z][^=(){}\[\]]{40,})$", re.MULTILINE)


def corpus() -> list[str]:
    """English-ish lines: the standard library's comments and docstring lines."""
    lines: list[str] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        lines += [match.group(1) or match.group(2) for match in COMMENT.finditer(text)]
    return lines[:SENTENCES]


def build_vocab(lines: list[str]) -> list[str]:
    """Specials, frequent words, ``##`` suffixes and single characters: 30,000 entries."""
    words = collections.Counter(word for line in lines
                                for word in re.findall(r"[a-z]+|[^\sa-z]", line.lower()))
    suffixes = collections.Counter(word[cut:] for word in words for cut in range(1, len(word))
                                   if len(word) - cut <= 4)
    chars = sorted({char for word in words for char in word})
    tokens = [*SPECIAL_TOKENS, "[MASK]", *chars, *(f"##{char}" for char in chars)]
    tokens += [f"##{suffix}" for suffix, _ in suffixes.most_common(3000)]
    seen = set(tokens)
    tokens += [word for word, _ in words.most_common() if word not in seen]
    return tokens[:VOCAB_SIZE]


def best_rate(encode: Callable[[str], int], lines: list[str]) -> tuple[float, int]:
    """(sentences per second, tokens) of the fastest of 5 passes."""
    best, tokens = float("inf"), 0
    for _ in range(5):
        started = time.perf_counter()
        tokens = sum(encode(line) for line in lines)
        best = min(best, time.perf_counter() - started)
    return len(lines) / best, tokens


def _report(what: str, rate: float, tokens: int, sentences: int) -> None:
    print(f"{what:38} {rate:9.0f} sentences/s {rate * tokens / sentences:10.0f} tokens/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-path", type=Path)
    args = parser.parse_args()
    lines = corpus()
    tokens = build_vocab(lines)
    ours = WordPieceTokenizer(Vocabulary(tokens))
    rate, count = best_rate(lambda line: len(ours.ids(line)), lines)
    print(f"{len(lines)} sentences, {count} tokens, vocabulary {len(tokens)}")
    _report("ours, word cache warm", rate, count, len(lines))
    rate, _ = best_rate(lambda line: (ours._words.clear(), len(ours.ids(line)))[1], lines)
    _report("ours, word cache cleared per sentence", rate, count, len(lines))
    if args.hf_path is None:
        return
    sys.path.insert(0, str(args.hf_path))
    from tokenizers import BertWordPieceTokenizer  # noqa: PLC0415 - optional, benchmark only

    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as file:
        file.write("".join(token + "\n" for token in tokens))
        file.flush()
        theirs = BertWordPieceTokenizer(file.name, lowercase=True, wordpieces_prefix="##")
    rate, count = best_rate(lambda line: len(theirs.encode(line, add_special_tokens=False).ids),
                            lines)
    _report("HF tokenizers, encode", rate, count, len(lines))
    batches = [lines[start:start + 32] for start in range(0, len(lines), 32)]
    rate, _ = best_rate(lambda batch: sum(len(encoding.ids) for encoding in theirs.encode_batch(
        batch, add_special_tokens=False)), batches)  # type: ignore[arg-type]
    _report("HF tokenizers, encode_batch of 32", rate * 32, count, len(lines))
    differ = sum(ours.ids(line) != theirs.encode(line, add_special_tokens=False).ids
                 for line in lines)
    print(f"sentences tokenised differently: {differ} of {len(lines)}")


if __name__ == "__main__":
    main()
