"""An int8 model's calibration at load: the inputs its ranges are taken from, and the load.

The inputs are the version's ``calibration.npz`` when the upload gave one (arrays named by
the config's input names, rows along axis 0, read without pickles), else
``calibration.samples`` seeded random rows of the sample inputs (standard normal for float
inputs, zeros for the others, as the precision check draws them, from another seed). The
model is then loaded again in int8 (`engine.load_model`'s ``calibration``), and the record of
what calibrated it goes into the version's ``checks.precision``.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.serving.config import CALIBRATION_NAME, ModelConfig, TensorConfig
from engine.serving.errors import InvalidModel, ServingError
from engine.serving.manifest import PARAMS_NAME, SYMBOL_NAME
from engine.serving.precision_check import SEED, random_inputs

CALIBRATION_SEED = SEED + 1


@dataclass(frozen=True)
class Calibrated:
    """The inputs an int8 model was calibrated on (by graph name) and how they were found."""

    feed: Mapping[str, np.ndarray] = field(repr=False)
    record: dict[str, Any]


def load_int8(loader: Callable[..., Any], version_dir: Path, config: ModelConfig,
              inputs: Sequence[TensorConfig], sample: Mapping[str, tuple[int, ...]] | None,
              *, device: str, where: str) -> tuple[Any, Calibrated]:
    """The version's model loaded in int8, calibrated on its inputs (see the module).

    Raises:
        InvalidModel: no calibration inputs, a calibration.npz that does not fit the inputs,
            or a model that does not load in int8.
    """
    calibrated = calibration_inputs(version_dir, config, inputs, sample, where)
    settings = {"mode": config.calibration.mode, "num_bins": config.calibration.num_bins}
    try:
        model = loader(version_dir / SYMBOL_NAME, version_dir / PARAMS_NAME, device=device,
                       precision="int8", calibration=calibrated.feed,
                       calibration_settings=settings)
    except ServingError:
        raise
    except (EngineError, ValueError, TypeError, OSError) as error:
        raise InvalidModel(f"{where}: cannot load the model in int8: {error}") from error
    return model, calibrated


def calibration_inputs(version_dir: Path, config: ModelConfig,
                       inputs: Sequence[TensorConfig],
                       sample: Mapping[str, tuple[int, ...]] | None, where: str) -> Calibrated:
    """The calibration inputs by graph name: ``calibration.npz``'s, else random sample rows."""
    path = version_dir / CALIBRATION_NAME
    settings = {"mode": config.calibration.mode, "num_bins": config.calibration.num_bins}
    if path.is_file():
        feed = read_calibration(path, inputs, config.max_batch_size > 0, where)
        source = CALIBRATION_NAME
    elif sample is None:
        raise InvalidModel(f"{where}: precision int8 needs calibration inputs: upload a "
                           f"{CALIBRATION_NAME} part, or give the inputs' shapes in config.json "
                           f"so that sample inputs can be drawn")
    else:
        rows = config.calibration.samples if config.max_batch_size > 0 else None
        graph_inputs = [tensor.model_copy(update={"name": tensor.graph_name, "source": None})
                        for tensor in inputs]
        # Another seed than the precision check's: the check runs on rows never calibrated on.
        feed = random_inputs(graph_inputs, sample, rows, seed=CALIBRATION_SEED)
        source = "random sample inputs"
    counts = {np.shape(array)[0] if np.ndim(array) else 1 for array in feed.values()}
    return Calibrated(feed, {"source": source, "rows": max(counts), **settings})


def read_calibration(path: Path, inputs: Sequence[TensorConfig], batched: bool,
                     where: str) -> dict[str, np.ndarray]:
    """``calibration.npz``'s arrays by graph name, checked against the inputs' config.

    Raises:
        InvalidModel: unreadable, pickled, or an array missing, unknown, of another dtype
            kind or of a shape the input does not take.
    """
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise InvalidModel(f"{where}: {CALIBRATION_NAME} is not a readable .npz of plain "
                           f"arrays: {error}") from error
    by_name = {tensor.name: tensor for tensor in inputs}
    unknown = sorted(set(arrays) - set(by_name))
    missing = sorted(set(by_name) - set(arrays))
    if unknown or missing:
        raise InvalidModel(f"{where}: {CALIBRATION_NAME} must hold one array per input "
                           f"({', '.join(sorted(by_name))}); unknown {unknown}, missing "
                           f"{missing}")
    feed = {}
    rows = set()
    for name, tensor in by_name.items():
        array = arrays[name]
        if array.dtype.kind != tensor.dtype.kind and not (
                array.dtype.kind in "iu" and tensor.dtype.kind in "iu"):
            raise InvalidModel(f"{where}: {CALIBRATION_NAME} array {name!r} is {array.dtype}; "
                               f"input {name!r} takes {tensor.dtype}")
        shape = tensor.shape or array.shape
        fixed = [(axis, dim) for axis, dim in enumerate(shape)
                 if dim > 0 and not (batched and axis == tensor.axis)]
        if array.ndim != len(shape) or any(array.shape[axis] != dim
                                                  for axis, dim in fixed):
            raise InvalidModel(f"{where}: {CALIBRATION_NAME} array {name!r} has shape "
                               f"{list(array.shape)}; input {name!r} takes "
                               f"{list(shape)} (-1: any size)")
        if array.ndim == 0 or array.shape[0] == 0:
            raise InvalidModel(f"{where}: {CALIBRATION_NAME} array {name!r} has no rows")
        rows.add(array.shape[0])
        feed[tensor.graph_name] = array.astype(tensor.dtype, copy=False)
    if len(rows) > 1:
        raise InvalidModel(f"{where}: {CALIBRATION_NAME}'s arrays must have one row count "
                           f"(axis 0); got {sorted(rows)}")
    return feed
