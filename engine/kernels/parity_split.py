"""An image copied into a zero-bordered buffer whose rows are split by column parity.

`conv_bind` pairs a stride-2 convolution's patches from such a buffer (`_bind_split_bands`):
padded column ``p`` of row ``y`` lies at ``split[c, y, p % 2, p // 2]``. NumPy makes it with
two strided copies, each reading every other float of the whole image; the compiled loop here
reads each input row once and writes both halves (ResNet-18's stem, 3 × 224², one thread,
warm: 34 µs against 40, and the input is read from memory once, not twice).

The copy is a `spin_pool` job of parts, each a run of the image's rows (`kernel_jobs`): a
batch-1 plan on two cores copied MobileNet v2's 3 × 224² input in one part, on its caller,
while the other core waited (60 µs of the stem's 0.2 ms).

numba is imported on first use (`engine.cpu.compiled`); compiled code is cached on disk.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from engine.cpu import compiled, kernel_jobs
from engine.cpu.compiled import compile_kernel, compiled_once
from engine.cpu.parts import PartedCall

_kernels: dict[str, Any] = {}


def copy(image: Any, split: Any, pad_y: int, pad_x: int) -> list[Any]:
    """Calls writing ``image`` (C, H, W) into the interior of ``split`` (C, rows, 2, half),
    its rows from ``pad_y``, its columns from padded column ``pad_x``: one compiled loop
    where numba runs it on float32 C-contiguous arrays, else one NumPy copy per half."""
    if (compiled.available() and image.dtype == np.float32 and split.dtype == np.float32
            and image.flags.c_contiguous and split.flags.c_contiguous):
        compiled_once(_kernels, _compile)  # compiled when bound, not on the first run
        return [SplitCopy(split_into, image, split, pad_y, pad_x)]
    height, width = image.shape[1:]
    calls = []
    for first in range(min(2, width)):  # input columns first, first + 2, …: one half's run
        at = first + pad_x
        count = len(range(first, width, 2))
        calls.append(partial(np.copyto, split[:, pad_y:pad_y + height, at % 2,
                                              at // 2:at // 2 + count], image[:, :, first::2]))
    return calls


class SplitCopy(PartedCall):
    """A bound `split_into`: numba's loop, never BLAS (a plan of such steps keeps its
    spin-pool workers across runs, `spin_pool.quiet_for_blas`); in a plan, a job of parts
    over the image's rows (`as_job`)."""

    leaves_blas_alone = True

    def as_job(self, workspace: Any) -> Any:
        """The copy as a `kernel_jobs` job, each part a run of the image's rows (channel by
        channel, row by row); None where the job cannot be bound."""
        image, split, pad_y, pad_x = self.args
        rows = image.shape[0] * image.shape[1]
        return kernel_jobs.bind((__name__, "split_rows"), (image, split, pad_y, pad_x), rows,
                                kernel_jobs.parts_for(rows, 2 * image.size))


def split_into(image: Any, split: Any, pad_y: int, pad_x: int) -> None:
    """The compiled copy (see `copy`). A copy only: it moves values and computes none, so a
    layer's epilogue may fold into the products around it (`gemm_bind`)."""
    _kernels["split_rows"](image, split, pad_y, pad_x, 0, image.shape[0] * image.shape[1])


def compiled_kernels() -> dict[str, Any]:
    """The kernels by name (`kernel_jobs` runs ``split_rows`` as jobs), compiled on first
    use."""
    return compiled_once(_kernels, _compile)


def _compile() -> dict[str, Any]:
    return {"split_rows": compile_kernel(_split_rows)}


def _split_rows(image: Any, split: Any, pad_y: int, pad_x: int, first: int,
                last: int) -> None:  # pragma: no cover - compiled
    # Rows [first, last) of the image, its channels' rows end to end. Each row's column pairs
    # (2j, 2j + 1) go to the two halves in one pass, which LLVM vectorises with shuffles (both
    # members of the pair read in one iteration).
    height, width = image.shape[1], image.shape[2]
    pairs = width // 2
    for index in range(first, last):
        channel, row = index // height, index % height
        source = image[channel, row]
        target = split[channel, pad_y + row]
        first_half = target[pad_x % 2, pad_x // 2:]  # input column 0's half, from its cell
        second_half = target[(pad_x + 1) % 2, (pad_x + 1) // 2:]
        for pair in range(pairs):
            first_half[pair] = source[2 * pair]
            second_half[pair] = source[2 * pair + 1]
        if width % 2:
            first_half[pairs] = source[width - 1]
