"""A version's warm-up: its ``model_warmup`` samples run before it is READY.

A compiled plan still pays on its first run: kernels loaded from numba's cache, kernel jobs
bound, working memory touched (0.4 s for a ResNet-18 at 224x224 on two cores, where the run
itself takes 0.1 s). A warm-up sample is a request of the model's own, run by the load, so
the first client request of its shape finds all of that done. The samples
(`engine.serving.warmup_config`) are turned into arrays against the completed config and run
straight through the model ``count`` times each; any failure refuses the load, naming the
sample and why.

Without samples, a CPU load compiles the plans of a few batch sizes instead
(`compile_sizes`), as a GPU load compiles and runs its batch buckets' plans.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.serving.config import TensorConfig
from engine.serving.errors import InvalidModel
from engine.serving.warmup_config import WarmupInput, WarmupSample

log = logging.getLogger(__name__)


class WarmupError(ValueError):
    """A sample's data cannot be made (the message says why; the caller names the sample)."""


def compile_sizes(max_batch_size: int, buckets: Sequence[int] | None,
                  samples: Sequence[WarmupSample]) -> tuple[int, ...]:
    """Batch sizes whose plans a load compiles beside its buckets' (none where there are
    buckets, which are compiled as such, or warm-up samples, which compile what they run).

    The CPU runs a batch at its exact size, so every size from 1 to ``max_batch_size`` could
    have plans of its own: 32 sizes by default, several seconds each for some shapes. Powers
    of two up to ``max_batch_size`` (and it) bound that to a handful whose plans cover the
    sizes clients most often send; other sizes compile on their first batch, or a warm-up
    names them.
    """
    if buckets or samples or max_batch_size < 1:
        return ()
    sizes = {1 << k for k in range(max_batch_size.bit_length()) if 1 << k <= max_batch_size}
    return tuple(sorted(sizes | {max_batch_size}))


def warm_up(model: Any, samples: Sequence[WarmupSample], inputs: Sequence[TensorConfig],
            sample_shapes: Mapping[str, tuple[int, ...]] | None, max_batch_size: int,
            version_dir: Path, where: str) -> list[dict[str, Any]]:
    """Run each sample ``count`` times through ``model.infer``; the record of what ran
    (name, batch size, runs, seconds), for the version's checks.

    ``inputs`` is the completed config's (client names; the model is fed graph names);
    ``sample_shapes`` the test inference's shapes by graph name, which fill the variable
    dimensions of inputs a sample gives no ``dims`` for; ``max_batch_size`` the completed
    config's (the load may have lowered the config's: a graph that takes one row, or whose
    shapes follow the data).

    Raises:
        InvalidModel: a sample's data could not be made or a run failed; the message names
            the sample and the reason.
    """
    record = []
    for index, sample in enumerate(samples):
        named = f"{where}: warm-up sample {sample.name!r} (model_warmup.{index})"
        if sample.batch_size > max(1, max_batch_size):
            raise InvalidModel(f"{named}: batch_size {sample.batch_size} is more than the "
                               f"model takes (max_batch_size {max_batch_size} after loading)")
        batched = max_batch_size > 0
        try:
            arrays = sample_arrays(sample, inputs, sample_shapes, batched, version_dir)
        except WarmupError as error:
            raise InvalidModel(f"{named}: {error}") from error
        start = time.perf_counter()
        for _ in range(sample.runs):
            try:
                model.infer(arrays)
            except Exception as error:  # noqa: BLE001 - whatever failed refuses the load
                raise InvalidModel(f"{named} failed at batch_size {sample.batch_size}: "
                                   f"{error}") from error
        seconds = time.perf_counter() - start
        log.info("%s: ran %d time(s) in %.3f s", named, sample.runs, seconds)
        record.append({"name": sample.name, "batch_size": sample.batch_size,
                       "runs": sample.runs, "seconds": round(seconds, 6)})
    return record


def sample_arrays(sample: WarmupSample, inputs: Sequence[TensorConfig],
                  sample_shapes: Mapping[str, tuple[int, ...]] | None, batched: bool,
                  version_dir: Path) -> dict[str, np.ndarray]:
    """One array per model input, by graph name: the sample's data, zeros where it gives
    none.

    Raises:
        WarmupError: an input the model does not have, a datatype or dims that do not fit
            the input, or a file that cannot be read as its data.
    """
    by_name = {tensor.name: tensor for tensor in inputs}
    unknown = sorted(set(sample.inputs) - set(by_name))
    if unknown:
        raise WarmupError(f"inputs {unknown} are not inputs of the model; it has "
                          f"{sorted(by_name)}")
    arrays = {}
    for tensor in inputs:
        entry = sample.inputs.get(tensor.name, WarmupInput())
        try:
            arrays[tensor.graph_name] = _array(entry, tensor, sample, sample_shapes, batched,
                                               version_dir)
        except WarmupError as error:
            raise WarmupError(f"input {tensor.name!r}: {error}") from error
    return arrays


def _array(entry: WarmupInput, tensor: TensorConfig, sample: WarmupSample,
           sample_shapes: Mapping[str, tuple[int, ...]] | None, batched: bool,
           version_dir: Path) -> np.ndarray:
    if entry.data_type is not None and entry.data_type != tensor.datatype:
        raise WarmupError(f"data_type {entry.data_type} does not match the input's "
                          f"datatype {tensor.datatype}")
    dtype = tensor.dtype
    row = _row_shape(entry, tensor, sample_shapes, batched)
    axis = tensor.axis
    shape = (*row[:axis], sample.batch_size, *row[axis:]) if batched else row
    source = entry.source
    if source == "zero_data":
        return np.zeros(shape, dtype)
    if source == "random_data":
        return _random(shape, dtype, sample.name)
    assert entry.input_data_file is not None
    data = _read_file(version_dir, entry.input_data_file, dtype, shape,
                      row if batched else None)
    if data.shape != shape:  # one row's data, the same in every row of the batch
        data = np.broadcast_to(np.expand_dims(data, axis), shape)
    return np.ascontiguousarray(data)


def _row_shape(entry: WarmupInput, tensor: TensorConfig,
               sample_shapes: Mapping[str, tuple[int, ...]] | None,
               batched: bool) -> tuple[int, ...]:
    """The input's shape without its batch dimension: the sample's ``dims``, checked against
    the declared shape, else the declared shape with variable dimensions taken from the test
    inference's."""
    assert tensor.shape is not None  # completed on load
    declared = [dim for axis, dim in enumerate(tensor.shape)
                if not batched or axis != tensor.axis]
    if entry.dims is not None:
        fits = len(entry.dims) == len(declared) and all(
            want in (-1, got) for want, got in zip(declared, entry.dims, strict=True))
        if not fits:
            raise WarmupError(f"dims {list(entry.dims)} do not fit the input's shape "
                              f"{declared} (without the batch dimension)")
        return tuple(entry.dims)
    if all(dim > 0 for dim in declared):
        return tuple(declared)
    if sample_shapes is None or tensor.graph_name not in sample_shapes:
        raise WarmupError(f"its shape {declared} (without the batch dimension) has variable "
                          "dimensions; give the sample's dims")
    probe = [dim for axis, dim in enumerate(sample_shapes[tensor.graph_name])
             if not batched or axis != tensor.axis]
    return tuple(probe)


def _random(shape: tuple[int, ...], dtype: np.dtype, name: str) -> np.ndarray:
    """Random data that any input of the dtype takes: floats in [0, 1), integers 0 or 1 (an
    index into the smallest embedding table), booleans either way; the same for a sample's
    name on every load."""
    rng = np.random.default_rng(list(name.encode()))
    if dtype.kind == "f":
        return rng.random(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(0, 2, shape).astype(dtype)


def _read_file(version_dir: Path, relative: str, dtype: np.dtype, shape: tuple[int, ...],
               row: tuple[int, ...] | None) -> np.ndarray:
    """The data of ``relative`` in the version's folder: a ``.npy`` array (never pickled
    objects) or raw bytes in row-major order, as Triton reads ``input_data_file``. Either
    holds the whole batch (``shape``) or one row (``row``), repeated in every row."""
    folder = version_dir.resolve()
    path = (folder / relative).resolve()
    if not path.is_relative_to(folder):
        raise WarmupError(f"input_data_file {relative!r} leads outside the model version's "
                          "folder (through a link)")
    if not path.is_file():
        raise WarmupError(f"input_data_file {relative!r} is not a file in the model "
                          "version's folder")
    shapes = [shape] if row is None else [shape, row]
    if path.suffix == ".npy":
        try:
            data = np.load(path, allow_pickle=False, mmap_mode="r")
        except (ValueError, OSError) as error:
            raise WarmupError(f"input_data_file {relative!r} is not a .npy array of "
                              f"numbers: {error}") from error
        if data.dtype != dtype:
            raise WarmupError(f"input_data_file {relative!r} holds {data.dtype}, the input "
                              f"takes {dtype}")
        if data.shape not in shapes:
            raise WarmupError(f"input_data_file {relative!r} has shape {list(data.shape)}; "
                              f"expected {' or '.join(str(list(s)) for s in shapes)}")
        return np.array(data)
    sizes = {int(np.prod(each, dtype=np.int64)) * dtype.itemsize: each for each in shapes}
    size = path.stat().st_size
    if size not in sizes:
        raise WarmupError(f"input_data_file {relative!r} has {size} bytes; raw {dtype} data "
                          f"of shape {' or '.join(str(list(s)) for s in shapes)} takes "
                          f"{' or '.join(str(n) for n in sizes)}")
    return np.frombuffer(path.read_bytes(), dtype).reshape(sizes[size])
