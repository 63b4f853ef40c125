"""A downsampling block's 1×1 stride-2 shortcut run inside its stride-2 3×3's step, over the
3×3's grid of bf16 pairs (`engine.kernels.shortcut_ride`, `conv_amx.shortcut_riders`)."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from bench import nets
from engine.kernels import bf16, conv_amx, conv_bind, shortcut_ride
from engine.kernels.workspace import Workspace
from tests.engine.kernels.test_conv_amx import (
    assert_armed_runs_store,
    constant,
    needs_direct,
    operands,
    reference,
    relative_error,
)

RNG = np.random.default_rng(29)
STRIDED_3X3 = ((3, 3), (2, 2), (1, 1), (1, 1))
SHORTCUT = ((1, 1), (2, 2), (1, 1), (0, 0))


def bind_block(batch: int, size: tuple[int, int], channels: int = 40, filters: int = 48,
               between: bool = False) -> tuple[np.ndarray, ...]:
    """A stride-2 3×3 and then a 1×1 stride-2 shortcut with a bias over the same input, bound
    as a plan binds them (each node noted first; ``between``: one more node noted between)."""
    workspace = Workspace(np, 0, precision="bf16")
    data, weight = operands(batch, channels, size, filters, (3, 3))
    point = constant(RNG.standard_normal((filters, channels, 1, 1)).astype(np.float32))
    bias = constant(RNG.standard_normal(filters).astype(np.float32))
    out_size = tuple(-(-side // 2) for side in size)
    out = np.full((batch, filters, *out_size), np.nan, np.float32)
    shortcut = np.full_like(out, np.nan)
    workspace.note_readers(out, ())
    body = conv_bind.bind(np, data, weight, None, out, STRIDED_3X3, workspace)
    if between:
        workspace.note_readers(np.empty(1, np.float32), ())
    workspace.note_readers(shortcut, ())
    ridden = conv_bind.bind(np, data, point, bias, shortcut, SHORTCUT, workspace)
    return body, ridden, data, weight, point, bias, out, shortcut


@needs_direct
@pytest.mark.parametrize(("batch", "size", "chunk_bytes"), [
    (1, (14, 14), None),  # one image
    (3, (11, 13), 1),  # odd sides, each image a chunk of its own: the grid shared
    (4, (12, 10), None),  # one chunk of four images
])
def test_the_shortcut_runs_in_the_strided_step_over_its_grid(
        monkeypatch: pytest.MonkeyPatch, batch: int, size: tuple[int, int],
        chunk_bytes: int | None) -> None:
    """The shortcut's own step does nothing; each chunk of the 3×3 runs the shortcut's
    product over its grid, which gives the rounded 1×1 convolution with its bias, as the
    shortcut bound alone does, byte for byte (the same words summed in the same order)."""
    if chunk_bytes is not None:
        monkeypatch.setattr(conv_amx, "CHUNK_GRID_BYTES", chunk_bytes)
    body, ridden, data, weight, point, bias, out, shortcut = bind_block(batch, size)
    assert ridden == [shortcut_ride.ridden_by_writer]
    assert len(body) == (batch if chunk_bytes is not None else 1)
    for call in (*body, *ridden):
        call()
    want = reference(bf16.rounded(data), bf16.rounded(point), (0, 0), (1, 1), (2, 2))
    assert relative_error(shortcut, want + bias.reshape(1, -1, 1, 1)) < 1e-5
    alone = np.full_like(shortcut, np.nan)
    scratch = conv_bind.scratch_bytes(data.shape, point.shape[0], alone.shape[2:], SHORTCUT,
                                      data.itemsize)
    for call in conv_bind.bind(np, data, point, bias, alone, SHORTCUT,
                               Workspace(np, scratch, precision="bf16")):
        call()
    np.testing.assert_array_equal(shortcut, alone)
    want = reference(bf16.rounded(data), bf16.rounded(weight), (1, 1), (1, 1), (2, 2))
    assert relative_error(out, want) < 1e-5  # the 3×3's own output as before


@needs_direct
def test_armed_runs_store_the_shortcut_as_one_thread_does() -> None:
    body, ridden, *_, shortcut = bind_block(1, (16, 16))
    for call in body:
        call()
    alone = shortcut.copy()

    def run() -> None:
        for call in (*body, *ridden):
            call()

    assert_armed_runs_store(shortcut, alone, run)


@needs_direct
def test_the_shortcut_rides_only_as_the_node_right_after_on_memory_of_its_own() -> None:
    """A node bound between the two, or a shortcut output on the 3×3's: bound alone."""
    _, ridden, *_ = bind_block(1, (14, 14), between=True)
    assert ridden != [shortcut_ride.ridden_by_writer]
    workspace = Workspace(np, 0, precision="bf16")
    data, weight = operands(1, 40, (14, 14), 48, (3, 3))
    point = constant(RNG.standard_normal((48, 40, 1, 1)).astype(np.float32))
    out = np.empty((1, 96, 7, 7), np.float32)
    workspace.note_readers(out, ())
    conv_bind.bind(np, data, weight, None, out[:, :48], STRIDED_3X3, workspace)
    workspace.note_readers(out, ())
    calls = conv_bind.bind(np, data, point, None, out[:, 48:].copy(), SHORTCUT, workspace)
    assert calls == [shortcut_ride.ridden_by_writer]  # on memory of its own it rides
    workspace.note_readers(out, ())
    conv_bind.bind(np, data, weight, None, out[:, :48], STRIDED_3X3, workspace)
    workspace.note_readers(out, ())
    calls = conv_bind.bind(np, data, point, None, out[:, :48], SHORTCUT, workspace)
    assert calls != [shortcut_ride.ridden_by_writer]


@needs_direct
@pytest.mark.parametrize("batch", [1, 3])
def test_resnet18_runs_its_three_shortcuts_in_the_strided_steps(
        monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    """A whole bf16 ResNet-18 (112×112): its three downsampling shortcuts ride, and the
    logits are those of the plan binding them alone, byte for byte, and within bf16's error
    of float32."""
    symbol = nets.resnet18_v1()
    params = nets.random_params(symbol, (1, 3, 112, 112), seed=7)
    feed = {"data": RNG.standard_normal((batch, 3, 112, 112)).astype(np.float32)}
    riding = engine.load_model(symbol, params, precision="bf16")
    got = riding.infer(feed)["output_output"]
    steps = riding.plan_for(feed).steps
    assert sum(step.call is shortcut_ride.ridden_by_writer for step in steps) == 3
    monkeypatch.setattr(conv_amx, "shortcut_riders", lambda *_: None)
    alone = engine.load_model(symbol, params, precision="bf16").infer(feed)["output_output"]
    np.testing.assert_array_equal(got, alone)
    want = engine.load_model(symbol, params).infer(feed)["output_output"]
    assert relative_error(got, want) < 2e-2
