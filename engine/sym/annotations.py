"""The ``__x__`` annotations MXNet records on variables (``__shape__``, ``__dtype__``, ...)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from engine.graph.infer import DTYPE_CODES
from engine.ops.attrs import format_attr

_CODE_OF_DTYPE = {name: code for code, name in DTYPE_CODES.items()}
_STORAGE_CODES = {"default": 0, "row_sparse": 1, "csr": 2}


def dtype_code(dtype: Any) -> int:
    """MXNet's integer code for a dtype (0 for float32, 2 for float16, ...)."""
    name = np.dtype(dtype).name
    if name not in _CODE_OF_DTYPE:
        raise ValueError(f"dtype {name} has no MXNet code; supported: "
                         f"{', '.join(sorted(_CODE_OF_DTYPE))}")
    return _CODE_OF_DTYPE[name]


def init_text(init: Any) -> str:
    """An initializer as MXNet stores it: a name, or the initializer's ``dumps()`` JSON."""
    if isinstance(init, str):
        return init
    dumps = getattr(init, "dumps", None)
    if callable(dumps):
        return str(dumps())
    return json.dumps([type(init).__name__.lower(), {}])


def variable_attrs(attr: Mapping[str, str] | None, shape: Any, lr_mult: float | None,
                   wd_mult: float | None, dtype: Any, init: Any, stype: str | None,
                   extra: Mapping[str, Any]) -> dict[str, str]:
    """The attribute dict of a new variable, spelled as MXNet spells it."""
    raw = {key: format_attr(value) for key, value in (attr or {}).items()}
    if shape is not None:
        raw["__shape__"] = format_attr(tuple(shape) if isinstance(shape, list) else shape)
    if lr_mult is not None:
        raw["__lr_mult__"] = str(lr_mult)
    if wd_mult is not None:
        raw["__wd_mult__"] = str(wd_mult)
    if dtype is not None:
        raw["__dtype__"] = str(dtype_code(dtype))
    if init is not None:
        raw["__init__"] = init_text(init)
    if stype is not None:
        if stype not in _STORAGE_CODES:
            raise ValueError(f"var: unknown stype {stype!r}; expected one of "
                             f"{', '.join(_STORAGE_CODES)}")
        raw["__storage_type__"] = str(_STORAGE_CODES[stype])
    for key, value in extra.items():
        if not (key.startswith("__") and key.endswith("__")):
            raise ValueError(f"var: attribute {key!r} is not supported; extra attributes must "
                             f"start and end with double underscores, e.g. __{key}__")
        raw[key] = str(value)
    return raw
