"""Write tiny exports that use MXNet's control-flow operators, with MXNet's outputs.

Usage (inside the fixture venv, see README.md)::

    python tools/mxnet_fixtures/generate_control_flow.py --out tests/fixtures/mxnet_extra

Each model lands in ``<out>/control_flow/<name>/`` in the layout of the model fixtures. They are
kept apart from ``models/``: a ``_cond`` predicate or a ``_while_loop`` stop condition reduces
over the whole batch, so the rows of a batch are not independent and a server that concatenates
requests would change the answers.

``_while_loop`` pads its stacked outputs to ``max_iterations`` rows and MXNet leaves the rows
after the last iteration uninitialised; the engine writes zeros there, and so do these fixtures
(the loop counter is an output, so the number of valid rows is known).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import mxnet as mx
import numpy as np
from generate_models import ModelSpec, export
from mxnet.gluon import nn

MAX_ITERATIONS = 6


class ForeachRNN(mx.gluon.HybridBlock):
    """A tanh RNN cell unrolled over time (axis 0) with ``foreach``; returns steps and state."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.i2h = nn.Dense(8, flatten=False, in_units=4)
            self.h2h = nn.Dense(8, flatten=False, in_units=8)

    def hybrid_forward(self, F, data, state):  # noqa: N803 (Gluon's signature)
        def step(item, states):
            hidden = F.tanh(self.i2h(item) + self.h2h(states[0]))
            return hidden, [hidden]

        outputs, states = F.contrib.foreach(step, data, [state])
        return outputs, states[0]


class WhileAccumulate(mx.gluon.HybridBlock):
    """A residual update repeated while the mean magnitude stays small (at most 5 times)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.fc = nn.Dense(4, flatten=False, in_units=4)

    def hybrid_forward(self, F, data):  # noqa: N803
        def keep_going(count, value):
            return (F.mean(F.abs(value)) < 1.5) * (count < 5)

        def body(count, value):
            updated = F.tanh(self.fc(value)) + value
            return updated * 2, (count + 1, updated)

        outputs, (count, value) = F.contrib.while_loop(
            keep_going, body, (F.zeros((1,)), data), max_iterations=MAX_ITERATIONS)
        return outputs, count, value


class CondBranch(mx.gluon.HybridBlock):
    """A Dense layer when the batch mean is positive, an elementwise formula otherwise."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.fc = nn.Dense(3, flatten=False, in_units=3)

    def hybrid_forward(self, F, data):  # noqa: N803
        return F.contrib.cond(F.mean(data) > 0, lambda: self.fc(data),
                              lambda: F.relu(data) * 2 - 1)


def rnn_batches(rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    return [{"data0": rng.uniform(-1, 1, (3, size, 4)).astype(np.float32),
             "data1": rng.uniform(-1, 1, (size, 8)).astype(np.float32)} for size in (1, 2)]


def loop_batches(rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    # Scales chosen so the loop stops on the counter in one batch and early in the other (MXNet
    # cannot run a loop that never iterates: its output shapes stay unknown).
    return [{"data": rng.uniform(-scale, scale, (2, 4)).astype(np.float32)}
            for scale in (0.2, 1.2)]


def cond_batches(rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    # One batch per branch: the mean of the first is positive, of the second negative.
    return [{"data": rng.uniform(0.1, 1, (2, 3)).astype(np.float32)},
            {"data": rng.uniform(-1, -0.1, (3, 3)).astype(np.float32)}]


def zero_padding(outputs: list[mx.nd.NDArray]) -> list[mx.nd.NDArray]:
    """Zero the stacked rows after the last iteration (outputs: steps, counter, value)."""
    steps = outputs[0].asnumpy()
    steps[int(outputs[1].asscalar()):] = 0
    return [mx.nd.array(steps), *outputs[1:]]


MODELS = (
    (ModelSpec("foreach_rnn_tiny", "foreach over 3 time steps of a tanh RNN cell, state 8",
               51, ForeachRNN, rnn_batches), None),
    (ModelSpec("while_loop_tiny", "while_loop with a data-dependent stop, max_iterations 6",
               52, WhileAccumulate, loop_batches), zero_padding),
    (ModelSpec("cond_tiny", "cond on the batch mean: Dense or relu*2-1", 53, CondBranch,
               cond_batches), None),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="fixture root; models go to <out>/control_flow/<name>")
    args = parser.parse_args()
    for spec, finish in MODELS:
        export(spec, args.out, group="control_flow", finish=finish)
        print(f"exported {spec.name}")


if __name__ == "__main__":
    main()
