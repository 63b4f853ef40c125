"""Convolutions bound into plans (`engine.kernels.conv_bind`) agree with the reference kernel."""

from __future__ import annotations

import numpy as np
import pytest

from engine import sym
from engine.kernels import bf16, conv_bind, gemm_kernel, jobs, parity_split, part_chain
from tests.engine.kernels.test_conv_amx import (
    assert_armed_runs_store,
    bf16_workspace,
    constant,
    reference,
    relative_error,
)
from tests.engine.runtime.helpers import load_pair, run_allocation

needs_amx = pytest.mark.skipif(not gemm_kernel.available(gemm_kernel.AMX),
                               reason="this CPU or kernel lacks AMX-BF16")

RNG = np.random.default_rng(3)

# (kernel, stride, pad, dilate): 2-D, 1-D and 3-D; strided 1x1 and 7x7 stems; dilation.
GEOMETRIES = [
    ((3, 3), (1, 1), (1, 1), (1, 1)),
    ((7, 7), (2, 2), (3, 3), (1, 1)),
    ((1, 1), (2, 2), (0, 0), (1, 1)),
    ((1, 1), (1, 1), (0, 0), (1, 1)),
    ((3, 3), (1, 1), (2, 2), (2, 2)),
    ((3, 2), (2, 1), (0, 1), (1, 1)),
    ((3,), (1,), (1,), (1,)),
    ((3, 3, 3), (1, 2, 1), (1, 1, 1), (1, 1, 1)),
]


def two_convs(kernel: tuple, stride: tuple, pad: tuple, dilate: tuple, no_bias: bool):
    """Two convolutions in a row (they share the plan's scratch) with a ReLU epilogue."""
    data = sym.var("data")
    first = sym.Convolution(data, kernel=kernel, stride=stride, pad=pad, dilate=dilate,
                            num_filter=5, no_bias=no_bias, name="first")
    second = sym.Convolution(sym.Activation(first, act_type="relu"), kernel=kernel, pad=pad,
                             dilate=dilate, num_filter=4, name="second")
    return second


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("no_bias", [False, True])
def test_bound_convolution_matches_reference(geometry: tuple, batch: int, no_bias: bool) -> None:
    kernel = geometry[0]
    spatial = {1: (11,), 2: (12, 10), 3: (7, 6, 5)}[len(kernel)]
    shape = (batch, 3, *spatial)
    optimized, reference = load_pair(two_convs(*geometry, no_bias), shape, RNG)
    for _ in range(2):  # a second run: the padding left in the workspace must still be zero
        x = RNG.normal(size=shape).astype(np.float32)
        got = optimized.infer({"data": x})["second_output"]
        want = reference.infer({"data": x})["second_output"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_samples_in_several_chunks_with_a_remainder(monkeypatch: pytest.MonkeyPatch) -> None:
    # 3 x (3*9) x (12*10) floats is ~13 KB of patches per sample: 30 KB takes two samples at
    # a time, so a batch of 5 runs as chunks of 2, 2 and 1.
    monkeypatch.setattr(conv_bind, "PATCH_BYTES", 30_000)
    optimized, reference = load_pair(two_convs((3, 3), (1, 1), (1, 1), (1, 1), False),
                                     (5, 3, 12, 10), RNG)
    x = RNG.normal(size=(5, 3, 12, 10)).astype(np.float32)
    np.testing.assert_allclose(optimized.infer({"data": x})["second_output"],
                               reference.infer({"data": x})["second_output"],
                               rtol=1e-4, atol=1e-4)
    plan = optimized.plan_for({"data": x})
    assert plan.workspace.scratch.nbytes < 60_000  # sized for a chunk, not the whole batch


def test_bound_convolutions_allocate_nothing_per_run() -> None:
    optimized, _ = load_pair(two_convs((3, 3), (1, 1), (1, 1), (1, 1), False), (2, 3, 64, 64),
                             RNG)
    feed = {"data": RNG.normal(size=(2, 3, 64, 64)).astype(np.float32)}
    plan = optimized.plan_for(feed)
    peak, _ = run_allocation(plan, feed, 10)
    # The smallest padded input is 2*3*66*66*4 = 105 KB and a patch array 2*45*4096*4 = 1.5 MB:
    # a run building either afresh would show here. What a run may use is numpy's bounded
    # ufunc buffer for the broadcast bias add (8192 elements) and small objects.
    assert peak < 48 * 1024, f"a run allocated up to {peak} bytes"


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize("batch", [1, 2])
def test_one_sample_in_bands_of_output_rows(monkeypatch: pytest.MonkeyPatch, geometry: tuple,
                                            batch: int) -> None:
    # Patches over 2 × 200 bytes go in bands of ~200 bytes' worth of output rows (the last
    # band shorter); each sample of a batch chunked one at a time is banded the same way.
    monkeypatch.setattr(conv_bind, "BAND_BYTES", 200)
    monkeypatch.setattr(conv_bind, "WIDE_POSITIONS", 1)
    kernel, stride, pad, _ = geometry
    spatial = {1: (23,), 2: (13, 10), 3: (7, 6, 5)}[len(kernel)]
    shape = (batch, 3, *spatial)
    optimized, reference = load_pair(two_convs(*geometry, False), shape, RNG)
    plan = optimized.plan_for({"data": np.zeros(shape, np.float32)})
    products = [step for step in plan.steps if getattr(step.call, "func", None) is np.matmul
                or isinstance(step.call, gemm_kernel.Product)]  # a band whose columns fit ours
    if not conv_bind.is_direct(shape, (kernel, stride, (1,) * len(kernel), pad)):
        assert len(products) > 2 * batch  # more than one band per sample and layer
    for _ in range(2):
        x = RNG.normal(size=shape).astype(np.float32)
        np.testing.assert_allclose(optimized.infer({"data": x})["second_output"],
                                   reference.infer({"data": x})["second_output"],
                                   rtol=1e-4, atol=1e-4)


def test_band_rows() -> None:
    # ResNet-18's stem at 224²: 3 × 7 × 7 × 112 × 112 floats (7.4 MB), in bands of ~1 MB.
    stem = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (3, 7, 7, 1, 112, 112),
                                           (0,) * 6)
    rows = conv_bind._band_rows(stem)
    assert 1 < rows < 112
    assert rows * 147 * 112 * 4 <= conv_bind.BAND_BYTES < (rows + 1) * 147 * 112 * 4
    small = np.zeros((3, 3, 3, 1, 28, 28), np.float32)  # 85 KB: one band
    assert conv_bind._band_rows(small) == 28


# Stride 2 across, padded, in a bf16 plan on AMX: (kernel, stride, pad, input size, dilation).
# Each image has 256 output positions or more: images are bound one at a time.
SPLIT_CASES = [
    ((7, 7), (2, 2), (3, 3), (225, 225), (1, 1)),  # ResNet's stem on an odd size, in bands
    ((7, 7), (2, 2), (3, 3), (33, 40), (1, 1)),
    ((3, 3), (2, 2), (1, 1), (57, 57), (1, 1)),
    ((5, 5), (2, 2), (2, 2), (36, 37), (1, 1)),
    ((3, 3), (1, 2), (1, 1), (19, 34), (1, 1)),  # stride 1 down
    ((4, 3), (2, 2), (2, 1), (40, 35), (1, 1)),  # an even window; pads of both parities
    ((3, 3), (2, 2), (2, 1), (41, 40), (2, 1)),  # dilated down
]


def assert_runs_twice(calls: list, out: np.ndarray, want: np.ndarray) -> None:
    """Two runs of the bound calls each fill ``out`` with ``want``: the second finds the
    split copy's border as the first left it."""
    for _ in range(2):
        out[...] = np.nan
        for call in calls:
            call()
        assert relative_error(out, want) < 1e-5


@needs_amx
@pytest.mark.parametrize("case", SPLIT_CASES, ids=str)
@pytest.mark.parametrize("batch", [1, 3])
def test_stride_2_across_pairs_from_an_input_split_by_column_parity(case: tuple,
                                                                    batch: int) -> None:
    """The input's even and odd columns are copied apart into the padded buffer, then each
    band pairs runs of adjacent floats: the result is the convolution of the bf16-rounded
    operands, summed in float32."""
    kernel, stride, pad, size, dilate = case
    data = RNG.standard_normal((batch, 3, *size)).astype(np.float32)
    weight = constant(RNG.standard_normal((20, 3, *kernel)).astype(np.float32))
    bias = constant(RNG.standard_normal(20).astype(np.float32))
    want = reference(bf16.rounded(data), bf16.rounded(weight), pad, dilate, stride)
    want += bias.reshape(1, -1, 1, 1)
    out = np.full(want.shape, np.nan, np.float32)
    calls = conv_bind.bind(np, data, weight, bias, out, (kernel, stride, dilate, pad),
                           bf16_workspace())
    copies = [call for call in calls if getattr(call, "func", None) is parity_split.split_into]
    # Per image, its copy into the split rows, then its products, paired from there: one
    # over every output row where the windows step two rows down and are undilated (each
    # input row paired once, `_bind_split_rows`), else one per band.
    assert len(copies) == batch and all(copy.args[0].shape == data.shape[1:] for copy in copies)
    products = [call for call in calls if call not in copies]
    assert all(isinstance(call, bf16.PairedProduct) for call in products)
    if stride == (2, 2) and dilate == (1, 1):
        assert len(products) == batch
    assert_runs_twice(calls, out, want)


@needs_amx
@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_a_non_finite_input_reaches_only_the_windows_holding_it(value: float) -> None:
    """The shared rows' extra words and the taps past a window pair zeros with zero
    weights, never another row's or column's input: a pixel that is not finite makes only
    the outputs whose windows hold it non-finite (inf times a zero weight would be NaN)."""
    kernel, stride, pad = (7, 7), (2, 2), (3, 3)
    data = RNG.standard_normal((1, 3, 40, 38)).astype(np.float32)
    for channel, row, column in ((1, 17, 20), (0, 18, 21), (2, 5, 6), (1, 30, 33)):
        data[0, channel, row, column] = value  # rows and columns of both parities
    weight = constant(RNG.standard_normal((20, 3, *kernel)).astype(np.float32))
    with np.errstate(invalid="ignore"):  # windows holding infinities of both signs
        want = reference(bf16.rounded(data), bf16.rounded(weight), pad, (1, 1), stride)
    out = np.full(want.shape, -1.0, np.float32)
    calls = conv_bind.bind(np, data, weight, None, out, (kernel, stride, (1, 1), pad),
                           bf16_workspace())
    assert sum(isinstance(call, bf16.PairedProduct) for call in calls) == 1
    for call in calls:
        call()
    np.testing.assert_array_equal(np.isfinite(out), np.isfinite(want))
    finite = np.isfinite(want)
    assert relative_error(out[finite], want[finite]) < 1e-5


@needs_amx
def test_shared_rows_armed_over_two_threads_store_what_one_thread_does() -> None:
    """The pairing and the batched product run as jobs of parts: over two threads each part
    writes its own rows and tiles, the same bytes as one thread."""
    data = RNG.standard_normal((2, 3, 64, 61)).astype(np.float32)
    weight = constant(RNG.standard_normal((64, 3, 7, 7)).astype(np.float32))
    out = np.full((2, 64, 32, 31), np.nan, np.float32)
    calls = conv_bind.bind(np, data, weight, None, out, ((7, 7), (2, 2), (1, 1), (3, 3)),
                           bf16_workspace())
    assert sum(isinstance(call, bf16.PairedProduct) for call in calls) == 2
    for call in calls:
        call()
    alone = out.copy()
    assert_armed_runs_store(out, alone, lambda: [call() for call in calls])


@pytest.mark.parametrize(("real", "kernel_y", "words"),
                         [(11, 7, (11, 12)), (12, 7, (12, 16)), (5, 3, (5, 6)),
                          (16, 4, (16, 16)), (2, 1, (16, 2))])
def test_row_blocks_make_a_window_whole_tiles(real: int, kernel_y: int,
                                              words: tuple) -> None:
    """Even and odd input rows' blocks hold at least the row's words, and a window's rows
    (even first) fill whole tiles of 16 words, with as few words as can."""
    got = conv_bind._row_words(real, kernel_y)
    assert got == words
    even, odd = got
    assert min(got) >= real and (-(-kernel_y // 2) * even + kernel_y // 2 * odd) % 16 == 0


@needs_amx
def test_stride_1_across_or_unpadded_reads_the_strided_view() -> None:
    """No split where the windows do not step two columns, or where no padded copy is made
    anyway (a 1×1 stride-2 shortcut pairs from its input directly)."""
    data = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    weight = constant(RNG.standard_normal((20, 3, 1, 1)).astype(np.float32))
    out = np.empty((1, 20, 8, 8), np.float32)
    calls = conv_bind.bind(np, data, weight, None, out, ((1, 1), (2, 2), (1, 1), (0, 0)),
                           bf16_workspace())
    assert not any(getattr(call, "func", None) in (np.copyto, parity_split.split_into)
                   for call in calls)


@needs_amx
def test_a_stem_and_its_relu_are_the_split_copy_and_the_bands_alone() -> None:
    """In a bf16 plan the stem's bias and ReLU stay in its products' epilogue: the split copy
    moves values only, so no pass over the output follows the bands."""
    import engine
    from bench import nets

    net = sym.Activation(sym.Convolution(sym.var("data"), num_filter=16, kernel=(7, 7),
                                         stride=(2, 2), pad=(3, 3), name="stem"),
                         act_type="relu", name="relu")
    params = nets.random_params(net, (1, 3, 40, 41), seed=5)
    model = engine.load_model(net, params, precision="bf16")
    feed = {"data": RNG.standard_normal((2, 3, 40, 41)).astype(np.float32)}
    plan = model.plan_for(feed)
    kinds = [getattr(jobs.source(step.call), "func", None) is parity_split.split_into
             or isinstance(step.call, bf16.PairedProduct) for step in plan.steps]
    assert all(kinds), [type(step.call).__name__ for step in plan.steps]
    got, want = model.infer(feed)["relu_output"], model.reference(feed)["relu_output"]
    assert got.min() == 0.0
    np.testing.assert_allclose(got, want, atol=3e-2 * np.abs(want).max())


def float32_bound(data: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
                  geometry: tuple, out: np.ndarray) -> list:
    """``conv_bind.bind``'s calls in a float32 plan's workspace, its scratch sized as a plan
    sizes it."""
    from engine.kernels.workspace import Workspace

    scratch = conv_bind.scratch_bytes(data.shape, weight.shape[0], out.shape[2:], geometry, 4)
    return conv_bind.bind(np, data, weight, bias, out, geometry, Workspace(np, scratch))


# SPLIT_CASES's windows wide enough for float32 to split (`conv_bind.SPLIT_MIN_KERNEL_WIDTH`),
# and a dilated-down one.
FLOAT32_SPLIT_CASES = [case for case in SPLIT_CASES if case[0][1] >= 5] + [
    ((5, 5), (2, 2), (2, 2), (41, 40), (2, 1))]


@pytest.mark.parametrize("case", FLOAT32_SPLIT_CASES, ids=str)
@pytest.mark.parametrize("batch", [1, 3])
def test_float32_stride_2_across_copies_patches_from_the_split_input(case: tuple,
                                                                     batch: int) -> None:
    """In float32 each image is copied once into the buffer split by column parity, and each
    band's patches are two copies from there (even taps, then odd) that the weight's
    reordered columns meet: the result is the convolution, to float32 rounding."""
    kernel, stride, pad, size, dilate = case
    data = RNG.standard_normal((batch, 3, *size)).astype(np.float32)
    weight = constant(RNG.standard_normal((20, 3, *kernel)).astype(np.float32))
    bias = constant(RNG.standard_normal(20).astype(np.float32))
    want = reference(data, weight, pad, dilate, stride) + bias.reshape(1, -1, 1, 1)
    out = np.full(want.shape, np.nan, np.float32)
    calls = float32_bound(data, weight, bias, (kernel, stride, dilate, pad), out)
    splits = [call for call in calls if getattr(call, "func", None) is parity_split.split_into]
    assert len(splits) == batch
    # No padded copy of the image: every other copy is a band's patches, read from the split
    # (one image's copies and products may be one chained job, `part_chain`).
    sources = [call.args[1] for call in calls if getattr(call, "func", None) is np.copyto]
    assert all(source.base is not None and source.strides[-1] == 4 for source in sources)
    assert sources or any(isinstance(call, part_chain.Chain) for call in calls)
    assert_runs_twice(calls, out, want)
    alone = out.copy()
    assert_armed_runs_store(out, alone, lambda: [call() for call in calls])


def test_float32_split_patch_copies_share_out_a_band_by_output_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Bound in bands (where no chain is made), the stem's patch copies run as jobs whose
    parts take whole output rows (every K row of them), the first part the first rows: the
    parts its product's column panels take (B's columns are the band's positions, row by
    row), so a thread's part of the product reads the patches its own part of the copy
    wrote."""
    import ctypes

    from engine.kernels import strided_kernel

    monkeypatch.setattr(conv_bind, "_chained_split_patches", lambda *args: None)
    geometry = ((7, 7), (2, 2), (1, 1), (3, 3))
    data = RNG.standard_normal((1, 3, 96, 96)).astype(np.float32)
    weight = constant(RNG.standard_normal((16, 3, 7, 7)).astype(np.float32))
    out = np.empty((1, 16, 48, 48), np.float32)
    copies = [call for call in float32_bound(data, weight, None, geometry, out)
              if getattr(call, "func", None) is np.copyto]
    assert len(copies) == 2  # even taps, odd taps: one band
    for copy in copies:
        target = copy.args[0]
        job = strided_kernel.job(*strided_kernel.operands(copy))
        task, context, parts = job.args[-3:]
        assert parts >= 2
        target[...] = np.nan
        ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(task)(
            context, 0, parts)
        # The patches are (K, rows, columns): the rows' axis is the one a row of columns apart.
        rows_axis = target.strides.index(out.shape[3] * 4)
        by_row = np.isfinite(np.moveaxis(target, rows_axis, 0)).reshape(out.shape[2], -1)
        whole = by_row.all(axis=1)
        assert (whole | ~by_row.any(axis=1)).all(), "a part copied some K of an output row"
        filled = int(whole.sum())
        assert 0 < filled < out.shape[2] and whole[:filled].all()


def test_float32_split_patches_only_where_they_pay() -> None:
    """Windows narrower than `SPLIT_MIN_KERNEL_WIDTH` over more channels than an image's,
    and a weight that may change (its reordered copy could go stale), read the padded
    input's strided view as before."""
    narrow = conv_bind.SPLIT_MIN_KERNEL_WIDTH - 1
    channels = conv_bind.IMAGE_CHANNELS + 1
    for width, writeable in ((narrow, False), (7, True)):
        geometry = ((3, width), (2, 2), (1, 1), (1, width // 2))
        data = RNG.standard_normal((1, channels, 12, 40)).astype(np.float32)
        weight = RNG.standard_normal((8, channels, 3, width)).astype(np.float32)
        weight.flags.writeable = writeable
        want = reference(data, weight, (1, width // 2), (1, 1), (2, 2))
        out = np.empty(want.shape, np.float32)
        calls = float32_bound(data, weight, None, geometry, out)
        assert not any(getattr(call, "func", None) is parity_split.split_into for call in calls)
        for call in calls:
            call()
        assert relative_error(out, want) < 1e-5


def stem_operands(size: tuple[int, int], filters: int) -> tuple[np.ndarray, ...]:
    data = RNG.standard_normal((1, 3, *size)).astype(np.float32)
    weight = constant(RNG.standard_normal((filters, 3, 7, 7)).astype(np.float32))
    bias = constant(RNG.standard_normal(filters).astype(np.float32))
    want = reference(data, weight, (3, 3), (1, 1), (2, 2)) + bias.reshape(1, -1, 1, 1)
    return data, weight, bias, want


def test_float32_stem_is_the_split_copy_and_one_chained_job() -> None:
    """One image's float32 stem is two jobs: its split copy, then one chain (`part_chain`)
    whose shares of output rows each copy their own patches and multiply them, one part a
    core; run alone and armed over two threads it stores the convolution."""
    from engine.cpu import spin_pool

    geometry = ((7, 7), (2, 2), (1, 1), (3, 3))
    data, weight, bias, want = stem_operands((96, 96), 32)
    out = np.full(want.shape, np.nan, np.float32)
    calls = float32_bound(data, weight, bias, geometry, out)
    assert [type(call) for call in calls] == [parity_split.SplitCopy, part_chain.Chain]
    chain = calls[1]
    # one part a core, each with as many shares, each share's patches (its product's B) at
    # most `CHAIN_SHARE_BYTES`
    assert chain.parts == conv_bind.CHAIN_PARTS_PER_CORE * spin_pool.cores()
    assert len(chain.by_part) == chain.parts
    assert len(chain.alone) % chain.parts == 0
    assert all(steps[-1].operands[1].nbytes <= conv_bind.CHAIN_SHARE_BYTES
               for table in chain.by_part for steps in table)
    assert_runs_twice(calls, out, want)
    alone = out.copy()
    assert_armed_runs_store(out, alone, lambda: [call() for call in calls])


def test_chained_stem_shares_reuse_one_region_per_part() -> None:
    """Where the chain runs in its parts, each part's table has every share reuse one region
    of patches, and the parts, which run at once, have regions apart; run as one part, every
    share reuses the first region, which stays in cache (eight regions took a ResNet-18 stem
    1.4× as long on one thread)."""
    geometry = ((7, 7), (2, 2), (1, 1), (3, 3))
    data, weight, bias, want = stem_operands((96, 96), 32)
    out = np.empty(want.shape, np.float32)
    chain = float32_bound(data, weight, bias, geometry, out)[1]

    def patch_regions(table: list) -> list[int]:
        # each share's product reads its patches as B (`gemm_kernel.bind_packed`)
        return [steps[-1].operands[1].ctypes.data for steps in table]

    alone = patch_regions(chain.alone)
    assert len(set(alone)) == 1
    by_part = [patch_regions(table) for table in chain.by_part]
    assert len(by_part) == chain.parts
    assert all(len(regions) == len(alone) and len(set(regions)) == 1 for regions in by_part)
    assert len({regions[0] for regions in by_part}) == chain.parts
    # the regions lie apart: each part's patches end before the next part's begin
    nbytes = max(steps[-1].operands[1].nbytes for steps in chain.alone)
    starts = sorted(regions[0] for regions in by_part)
    assert all(later - earlier >= nbytes for earlier, later in zip(starts, starts[1:]))


def test_image_stem_shares_hold_at_most_about_a_share_of_positions() -> None:
    """A stem over an image's three channels (K 27) has small patches an output row: its
    shares are cut by positions (`CHAIN_SHARE_POSITIONS`, whole output rows), not only by
    bytes, and still store the convolution."""
    geometry = ((3, 3), (2, 2), (1, 1), (1, 1))
    data = RNG.standard_normal((1, 3, 128, 128)).astype(np.float32)
    weight = constant(RNG.standard_normal((32, 3, 3, 3)).astype(np.float32))
    want = reference(data, weight, (1, 1), (1, 1), (2, 2))
    out = np.full(want.shape, np.nan, np.float32)
    calls = float32_bound(data, weight, None, geometry, out)
    chain = calls[-1]
    assert isinstance(chain, part_chain.Chain)
    positions = out.shape[2] * out.shape[3]
    # by bytes alone (27 × 4096 floats, under `CHAIN_SHARE_BYTES`) one share a part
    assert 27 * positions * 4 <= conv_bind.CHAIN_SHARE_BYTES
    assert len(chain.alone) >= positions // conv_bind.CHAIN_SHARE_POSITIONS
    # each share's product reads its patches as B, whole output rows
    widths = [steps[-1].operands[1].shape[1] for steps in chain.alone]
    assert sum(widths) == positions
    assert all(width % out.shape[3] == 0 for width in widths)
    assert max(widths) <= conv_bind.CHAIN_SHARE_POSITIONS + out.shape[3]
    assert_runs_twice(calls, out, want)


def test_float32_stem_bias_and_relu_fold_into_the_chain() -> None:
    """In a float32 plan the stem's bias and ReLU are added by the chain's products as they
    store: the plan's steps are the split copy and the chain alone, and its runs, on one
    thread and armed, match the reference."""
    import engine
    from bench import nets
    from engine.cpu import spin_pool

    net = sym.Activation(sym.Convolution(sym.var("data"), num_filter=32, kernel=(7, 7),
                                         stride=(2, 2), pad=(3, 3), name="stem"),
                         act_type="relu", name="relu")
    params = nets.random_params(net, (1, 3, 96, 96), seed=5)
    model = engine.load_model(net, params, precision="fp32")
    feed = {"data": RNG.standard_normal((1, 3, 96, 96)).astype(np.float32)}
    plan = model.plan_for(feed)
    kinds = [type(jobs.source(step.call)) for step in plan.steps]
    assert kinds == [parity_split.SplitCopy, part_chain.Chain], kinds
    want = model.reference(feed)["relu_output"]
    got = model.infer(feed)["relu_output"]
    assert got.min() == 0.0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    with spin_pool.armed(2):
        np.testing.assert_array_equal(model.infer(feed)["relu_output"], got)


@pytest.mark.parametrize("channels", [3, conv_bind.IMAGE_CHANNELS + 1])
def test_float32_image_convolution_splits_and_chains(channels: int) -> None:
    """A float32 3×3 stride-2 convolution over an image (MobileNet v2's stem) is its split
    copy and one chain, though its windows are narrow; over more channels it reads the
    padded input's strided view in bands. Either way, alone and armed, it stores the
    convolution."""
    geometry = ((3, 3), (2, 2), (1, 1), (1, 1))
    data = RNG.standard_normal((1, channels, 128, 128)).astype(np.float32)
    weight = constant(RNG.standard_normal((32, channels, 3, 3)).astype(np.float32))
    bias = constant(RNG.standard_normal(32).astype(np.float32))
    want = reference(data, weight, (1, 1), (1, 1), (2, 2)) + bias.reshape(1, -1, 1, 1)
    out = np.full(want.shape, np.nan, np.float32)
    calls = float32_bound(data, weight, bias, geometry, out)
    image = channels <= conv_bind.IMAGE_CHANNELS
    kinds = [type(call) for call in calls]
    assert (kinds == [parity_split.SplitCopy, part_chain.Chain]) == image, kinds
    assert_runs_twice(calls, out, want)
    alone = out.copy()
    assert_armed_runs_store(out, alone, lambda: [call() for call in calls])
