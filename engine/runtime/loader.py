"""`load_model`: read a symbol and its parameters from paths, bytes or objects into a `Model`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from engine.device import Device
from engine.errors import ModelFormatError
from engine.graph.ir import Graph
from engine.graph.json_format import graph_from_json
from engine.graph.params import load_params, split_arg_aux
from engine.runtime.lru import DEFAULT_CAPACITY
from engine.runtime.model import Model


def load_model(symbol: Any, params: Any = None, *, device: str | Device | Any = "cpu",
               optimize: bool | list[str] = True, batch_buckets: Iterable[int] | None = None,
               plan_cache_size: int = DEFAULT_CAPACITY, keep_batch: bool = False,
               precision: str = "fp32", calibration: Mapping[str, Any] | None = None,
               calibration_settings: Any = None) -> Model:
    """Load an exported model.

    Args:
        symbol: a ``*-symbol.json`` path, its text or bytes, a parsed dict, a `Graph`, or a
            `Symbol` (anything with ``to_graph()``).
        params: a ``*.params`` path or bytes, a dict of arrays (``arg:``/``aux:`` prefixes
            optional), or None for a graph without parameters.
        device: ``"cpu"``, ``"gpu"``, ``"gpu:N"``, ``"auto"`` (the GPU when CuPy sees one), a
            `Context` such as ``engine.gpu(0)``, or an `engine.device.Device` (which also carries
            the TF32 and CUDA-graph switches).
        optimize: True for every compiler pass, False for the reference interpreter, or a list
            of pass names.
        batch_buckets: batch sizes (positive integers) to pad a batch up to: a batch runs in
            the plan of the smallest bucket holding its rows, so a few plans serve every batch
            size up to the largest bucket (larger batches run their exact size). None (the
            default) compiles one plan per batch size. A served model's ``config.json`` sets
            the same thing (``batch_buckets``).
        plan_cache_size: input signatures (names, shapes, dtypes) whose compiled plans and
            inferred shapes are kept, least recently used evicted first; bounds the memory a
            client sending ever new shapes can make the model hold.
        keep_batch: refuse (`InputError`) input shapes for which shape inference gives an
            output another number of rows than the inputs (what a server batching rows needs).
        precision: what the model computes in: ``"fp32"`` (the default); ``"bf16"`` (the
            Dense and Convolution products' operands rounded to bf16, float32 sums;
            everything else float32; a CPU without AVX-512 BF16 runs it in fp32 and logs it
            once, ``model.precision`` says what runs); ``"fp16"`` on a GPU (every op in half
            between float32 inputs and outputs, float32 accumulation); ``"int8"`` on the CPU
            (the Convolution and FullyConnected layers in int8, ranges calibrated on
            ``calibration``; a CPU without our int8 kernels, neither AVX2 nor AVX-512 VNNI,
            runs a float32 model in fp32 and logs it once, an int8 export as it is).
            ``"int8"`` on a GPU, and ``"fp16"`` on the CPU, are refused.
        calibration: for int8, input arrays by name (rows along axis 0) whose float32 run
            gives each quantized tensor its range.
        calibration_settings: for int8, an `engine.quantize.CalibrationSettings` or a dict of
            its fields (``mode``: ``"naive"`` min/max or ``"entropy"``; ``num_bins``;
            ``batch_rows``).

    Returns:
        A `Model` whose ``infer`` maps input names to arrays.

    Raises:
        ModelFormatError: the files are malformed, name unknown ops, or do not fit together.
        ValueError: ``device`` names no device, ``batch_buckets`` holds other than positive
            integers, or ``precision`` names no precision this device runs.
        EngineError: ``device`` asks for a GPU that CuPy cannot see (the message says why).

    Example:
        >>> model = engine.load_model("my_mlp-symbol.json", "my_mlp-0000.params")
        >>> model.input_names
        ['data']
    """
    return Model(read_graph(symbol), read_params(params), device=device, optimize=optimize,
                 batch_buckets=batch_buckets, plan_cache_size=plan_cache_size,
                 keep_batch=keep_batch, precision=precision,
                 calibration=calibration, calibration_settings=calibration_settings)


def read_graph(symbol: Any) -> Graph:
    """A `Graph` from any of the forms `load_model` accepts for ``symbol``."""
    if isinstance(symbol, Graph):
        return symbol
    if hasattr(symbol, "to_graph"):
        return symbol.to_graph()
    if isinstance(symbol, (bytes, bytearray, memoryview, dict)):
        return graph_from_json(bytes(symbol) if isinstance(symbol, memoryview) else symbol)
    if isinstance(symbol, str) and symbol.lstrip().startswith("{"):
        return graph_from_json(symbol)
    if isinstance(symbol, (str, os.PathLike)):
        return graph_from_json(_read_file(symbol))
    raise TypeError(f"symbol must be a path, JSON text/bytes, a dict, a Graph or a Symbol; "
                    f"got {type(symbol).__name__}")


def read_params(params: Any) -> dict[str, np.ndarray]:
    """Parameter arrays by graph variable name (``arg:``/``aux:`` prefixes stripped)."""
    if params is None:
        return {}
    if isinstance(params, Mapping):
        arrays = {name: _as_numpy(value) for name, value in params.items()}
    elif isinstance(params, (bytes, bytearray, memoryview)):
        arrays = load_params(params).as_dict()
    elif isinstance(params, (str, os.PathLike)):
        arrays = load_params(_read_file(params)).as_dict()
    else:
        raise TypeError(f"params must be a path, bytes or a dict of arrays; "
                        f"got {type(params).__name__}")
    args, auxs = split_arg_aux(arrays)
    overlap = sorted(set(args) & set(auxs))
    if overlap:
        raise ModelFormatError(f"parameter {overlap[0]!r} appears both as arg: and aux:")
    return {**args, **auxs}


def _read_file(path: str | os.PathLike) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ModelFormatError(f"cannot read {os.fspath(path)!r}: {error.strerror}") from None


def _as_numpy(value: Any) -> np.ndarray:
    return value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value)
