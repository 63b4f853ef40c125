"""The time-major GluonNLP LSTM language model as a sequence model: its config.json with h
and c as implicit states, and MXNet's whole sentences from zero states (``sequences.npz``,
made by tools/mxnet_fixtures/generate_sequences.py). Shared by the engine, service and e2e
tests of stateful sequences."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.conformance.fixtures import model_dir

LSTM = "gluonnlp_lstm_lm_tnc"
TOLERANCE = {"rtol": 1e-3, "atol": 1e-5}  # RNN models need 1e-3 (see tests/conformance)
PREFIX = "statefullm0_standardrnn0_"
TENSORS = {"inputs": [{"name": "tokens", "source": "data0"}, {"name": "h_in", "source": "data1"},
                      {"name": "c_in", "source": "data2"}],
           "outputs": [{"name": "logits", "source": PREFIX + "hybridsequential1_dense0_fwd_output"},
                       {"name": "h", "source": PREFIX + "lstm0_rnn0_state_output"},
                       {"name": "c", "source": PREFIX + "lstm0_rnn0_statecell_output"}]}
STATES = [{"input_name": "h_in", "output_name": "h"}, {"input_name": "c_in", "output_name": "c"}]


def sequence_config(**sequence_batching: Any) -> dict[str, Any]:
    """The LSTM's config.json: its tensors renamed, h and c as implicit states (sequences
    idle for a minute before they are dropped: a busy machine never drops them here)."""
    return {**TENSORS, "sequence_batching": {"state": STATES, "max_sequence_idle_microseconds":
                                             60_000_000, **sequence_batching}}


def reference() -> tuple[np.ndarray, np.ndarray]:
    """MXNet's sentences (tokens ``[10, 8]``) and logits ``[10, 8, 100]`` from zero states."""
    with np.load(model_dir(LSTM) / "sequences.npz") as data:
        return data["tokens"], data["logits"]
