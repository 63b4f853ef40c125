"""Cases for the interleaved multi-head attention matmuls that GluonNLP's BERT exports use."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from casefile import Case

Rng = Callable[[str], np.random.Generator]


def attention_cases(rng_for: Rng) -> list[Case]:
    """Self-attention and encoder-decoder attention, scores and weighted values."""
    rng = rng_for("attention")
    length, batch, heads, width = 5, 2, 3, 4
    qkv = rng.standard_normal((length, batch, heads * 3 * width)).astype(np.float32)
    self_scores = rng.random((batch * heads, length, length)).astype(np.float32)
    queries = rng.standard_normal((4, batch, heads * width)).astype(np.float32)
    keys_values = rng.standard_normal((length, batch, heads * 2 * width)).astype(np.float32)
    cross_scores = rng.random((batch * heads, 4, length)).astype(np.float32)
    attrs = {"heads": str(heads)}
    return [
        Case("selfatt_qk", "_contrib_interleaved_matmul_selfatt_qk",
             {"queries_keys_values": qkv}, attrs),
        Case("selfatt_valatt", "_contrib_interleaved_matmul_selfatt_valatt",
             {"queries_keys_values": qkv, "attention": self_scores}, attrs),
        Case("encdec_qk", "_contrib_interleaved_matmul_encdec_qk",
             {"queries": queries, "keys_values": keys_values}, attrs),
        Case("encdec_valatt", "_contrib_interleaved_matmul_encdec_valatt",
             {"keys_values": keys_values, "attention": cross_scores}, attrs),
        Case("selfatt_qk_one_head", "_contrib_interleaved_matmul_selfatt_qk",
             {"queries_keys_values": qkv[..., :3 * width]}, {"heads": "1"}),
        Case("div_sqrt_dim", "_contrib_div_sqrt_dim", {"data": queries}),
    ]
