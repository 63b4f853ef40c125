"""Whole sentences through the served LSTM language model, begun from zero states, by MXNet.

A sequence model's state starts as zeros (``sequence_batching``'s ``zero_data``), so the
reference a token-by-token sequence is compared with is the whole sentence run once from zero
begin states. Reads the exported ``gluonnlp_lstm_lm_tnc`` fixture (symbol and params) and
writes ``sequences.npz`` beside it: ``tokens`` (8 sentences of 10 tokens, time-major
``[10, 8]``), ``logits`` (``[10, 8, 100]``) and the final states ``h`` and ``c``
(``[2, 8, 32]``).

    /tmp/mxvenv/bin/python tools/mxnet_fixtures/generate_sequences.py \
        --model tests/fixtures/mxnet_extra/serving/gluonnlp_lstm_lm_tnc
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mxnet as mx
import numpy as np

STEPS, SENTENCES, SEED = 10, 8, 38


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the fixture's folder")
    folder = parser.parse_args().model
    meta = json.loads((folder / "meta.json").read_text())
    block = mx.gluon.SymbolBlock.imports(str(folder / meta["symbol_file"]),
                                         ["data0", "data1", "data2"],
                                         str(folder / meta["params_file"]))
    vocabulary = meta["outputs"][0]["shape"][-1]
    layers, _, units = meta["inputs"][1]["shape"]
    tokens = np.random.default_rng(SEED).integers(0, vocabulary, (STEPS, SENTENCES))
    tokens = tokens.astype(np.float32)
    zeros = mx.nd.zeros((layers, SENTENCES, units))
    logits, h, c = block(mx.nd.array(tokens), zeros, zeros)
    np.savez(folder / "sequences.npz", tokens=tokens, logits=logits.asnumpy(), h=h.asnumpy(),
             c=c.asnumpy())


if __name__ == "__main__":
    main()
