"""The channels-last grid a direct bf16 convolution on AMX reads as its A operand
(`conv_amx_lines_ir`), and its weights packed as B.

The grid holds each pixel of the zero-bordered input as ``words`` words (its channels in bf16,
two a word, padded to a multiple of 32 channels), pixels one after another, each image's
``Hp·Wp`` pixels on from the last: a tile of 16 pixels × 32 channels is then 16 aligned
64-byte lines. The pass (`grid_pass`) writes the input's pixels into it on every run; the
border, zeroed once when the plan binds, stays zero.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.cpu import kernel_jobs, spin_pool
from engine.kernels import bf16
from engine.kernels.workspace import empty_aligned

PIXELS = 16  # pixels the grid pass rounds and transposes at a time


def weight_tiles(weight: Any, words: int) -> np.ndarray:
    """The weight (F, C, kh, kw) as AMX's B for `conv_amx_lines_ir`: per block of 32 filters,
    per 16 words of K (K ordered (tap, channel), each tap's channels padded to ``words``
    pairs), two tiles (filters 0-15, 16-31) of 16 channel pairs × 16 filters, contiguous in
    the order the kernel loads them; float32-viewed words, (filters padded to 32, K words)."""
    filters, channels = weight.shape[:2]
    taps = math.prod(weight.shape[2:])
    ordered = np.zeros((filters, taps, 2 * words), np.float32)
    ordered[:, :, :channels] = weight.reshape(filters, channels, taps).transpose(0, 2, 1)
    rows = bf16.amx_weight_rows(ordered.reshape(filters, -1))  # (filters, pairs) words
    count, depth = rows.shape
    tiles = rows.reshape(count // 32, 2, 16, depth // 16, 16).transpose(0, 3, 1, 4, 2)
    packed = empty_aligned(np, (count, depth), np.float32)
    packed[...] = tiles.reshape(count, depth)
    return packed


def pixel_table(shape: Any, grid_width: int, pad: Any) -> np.ndarray:
    """Each input pixel's grid pixel within its image (stride 1: the input at ``pad`` from
    the grid's corner, rows ``grid_width`` pixels), padded with zeros to whole blocks of
    `PIXELS` (the pass reads a block's entries whole, storing only its pixels')."""
    height, width = shape[2:]
    rows, columns = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    table = np.zeros(-(-height * width // PIXELS) * PIXELS, np.int64)
    table[:height * width] = ((rows + pad[0]) * grid_width + columns + pad[1]).reshape(-1)
    return table


def grid_pass(task: int, data: Any, grid: Any, table: np.ndarray, image: int) -> Any:
    """A `spin_pool` job of ``task`` (`conv_amx_lines_ir`'s ``lines_grid``) writing ``data``
    (float32 NCHW, C-contiguous) into ``grid`` (float32-viewed words, a row a pixel, images
    ``image`` pixels apart, from a 64-byte boundary) at the pixels ``table`` gives."""
    batch, channels, height, width = data.shape
    if grid.ndim != 2 or grid.shape[1] < -(-channels // 32) * 16 or grid.shape[1] % 16:
        raise ValueError(f"a channels-last grid of {grid.shape} words cannot hold "
                         f"{channels} channels a pixel")
    if grid.ctypes.data % 64 or not grid.flags.c_contiguous:
        raise ValueError("a channels-last grid must be C-contiguous from a 64-byte boundary: "
                         "each pixel's lines are stored whole")
    if grid.shape[0] < (batch - 1) * image + int(table.max(initial=0)) + 1:
        raise ValueError(f"a channels-last grid of {grid.shape[0]} pixels is too small for "
                         f"{batch} images of {image}")
    context = np.array([data.ctypes.data, channels, height * width, batch, grid.ctypes.data,
                        grid.shape[1], image, table.ctypes.data], np.int64)
    blocks = batch * -(-height * width // PIXELS)
    parts = kernel_jobs.parts_for(blocks, 2 * data.size)
    return spin_pool.job(task, context, parts, keep=(data, grid, table))
