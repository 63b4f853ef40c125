"""Access to the MXNet 1.9.1 reference data and its tolerances.

``tests/fixtures/mxnet`` holds the original reference exports; ``tests/fixtures/mxnet_extra`` holds
the cases that ``tools/mxnet_fixtures`` generates. Both operator sets share one format and are read
as one list of cases.
"""

from __future__ import annotations

import json
import threading
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CONFORMANCE = ROOT / "tests" / "fixtures" / "mxnet"
MODELS = CONFORMANCE / "models"
PARAMS = CONFORMANCE / "params"
EXTRA = ROOT / "tests" / "fixtures" / "mxnet_extra"
# `ops` holds the generator's main set; each `ops_<topic>` folder a set written on its own
# (`generate_ops.py --only`), so sets can be regenerated without touching each other.
OP_CASE_DIRS = (CONFORMANCE / "ops", EXTRA / "ops", *sorted(EXTRA.glob("ops_*")))
MODEL_DIRS = (MODELS, EXTRA / "models")
# Control-flow exports (tools/mxnet_fixtures/generate_control_flow.py) are kept out of
# `model_names`: a `_cond` predicate or `_while_loop` stop condition reduces over the whole
# batch, so the tests that batch or split rows, and ONNX export (which refuses these ops),
# cannot take them. `tests/conformance/test_control_flow.py` runs them.
CONTROL_FLOW = EXTRA / "control_flow"
# Exports with a data-dependent shape (tools/mxnet_fixtures/generate_dynamic.py), kept apart for
# the same reason: their masks select among the rows of the whole batch.
DYNAMIC = EXTRA / "dynamic"
# GluonNLP exports as users make them for serving (generate_models.py's SERVING_MODELS), with
# their own layouts: the language models are time-major, so their batch is axis 1. Kept apart
# from `model_names`, whose tests batch and split along axis 0.
SERVING = EXTRA / "serving"

DEFAULT_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
FLOAT16_TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}


@cache
def op_cases() -> list[dict[str, Any]]:
    """Every operator case of every set, in file order; case ids are unique across sets."""
    cases = [case for folder in OP_CASE_DIRS
             for case in json.loads((folder / "cases.json").read_text())["cases"]]
    ids = [case["id"] for case in cases]
    duplicates = sorted({case_id for case_id in ids if ids.count(case_id) > 1})
    if duplicates:
        raise ValueError(f"operator case ids appear in more than one set: {duplicates}")
    return cases


@cache
def op_arrays() -> dict[str, np.ndarray]:
    """Inputs and expected outputs of every operator case, keyed ``<id>/in<k>``/``<id>/out<k>``."""
    arrays: dict[str, np.ndarray] = {}
    for folder in OP_CASE_DIRS:
        with np.load(folder / "cases.npz") as data:
            arrays.update({key: data[key] for key in data.files})
    return arrays


def model_names(*, fixed_batch: bool = False) -> list[str]:
    """Names of the exported conformance models of every set.

    Models whose graph fixes the batch size (``meta.json`` ``fixed_batch``: GluonCV's Faster
    R-CNN bakes ``per_device_batch_size`` in) are left out unless `fixed_batch`: tests that run
    or plan larger batches cannot take them. ``test_models.py`` and the family tests do.
    """
    names = sorted(path.name for folder in MODEL_DIRS for path in folder.iterdir()
                   if path.is_dir())
    return [name for name in names if fixed_batch or not model_meta(name).get("fixed_batch")]


def control_flow_names() -> list[str]:
    """Names of the control-flow exports (``_foreach``, ``_while_loop``, ``_cond``)."""
    return sorted(path.name for path in CONTROL_FLOW.iterdir() if path.is_dir())


def serving_names() -> list[str]:
    """Names of the serving exports (see `SERVING`)."""
    return sorted(path.name for path in SERVING.iterdir() if path.is_dir())


def model_dir(name: str) -> Path:
    """The folder holding one conformance model, whichever set it belongs to."""
    for folder in (*MODEL_DIRS, CONTROL_FLOW, DYNAMIC, SERVING):
        if (folder / name).is_dir():
            return folder / name
    raise KeyError(f"no conformance model named {name!r}")


def model_meta(name: str) -> dict[str, Any]:
    """``meta.json`` of one conformance model."""
    return json.loads((model_dir(name) / "meta.json").read_text())


def model_files(name: str) -> tuple[Path, Path]:
    """(symbol file, params file) of one conformance model."""
    meta = model_meta(name)
    return model_dir(name) / meta["symbol_file"], model_dir(name) / meta["params_file"]


# np.load parses each array's header with ast.literal_eval, which CPython 3.11 cannot run in two
# threads at once (python/cpython#106905); load tests read io sets from several threads.
_NPZ_LOCK = threading.Lock()


def model_io_sets(name: str) -> list[tuple[dict[str, np.ndarray], list[np.ndarray]]]:
    """Every (inputs, expected outputs) set of one model's ``io.npz``."""
    meta = model_meta(name)
    with _NPZ_LOCK, np.load(model_dir(name) / "io.npz") as data:
        return [({input_name: data[key] for input_name, key in io_set["inputs"].items()},
                 [data[key] for key in io_set["outputs"]]) for io_set in meta["io_sets"]]


def tolerance_for(dtype: np.dtype, override: dict[str, float] | None = None) -> dict[str, float]:
    """The README's tolerance for a dtype, or a case's own override."""
    if override:
        return {"rtol": override.get("rtol", 0.0), "atol": override.get("atol", 0.0)}
    if np.dtype(dtype) == np.float16:
        return FLOAT16_TOLERANCE
    if np.issubdtype(dtype, np.floating):
        return DEFAULT_TOLERANCE
    return {"rtol": 0.0, "atol": 0.0}


def assert_close(actual: Any, expected: np.ndarray, tolerance: dict[str, float],
                 what: str = "") -> None:
    """``|actual - expected| <= atol + rtol * |expected|`` elementwise, with matching shapes."""
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                               rtol=tolerance["rtol"], atol=tolerance["atol"], err_msg=what)
