"""`Parameter` (a named array with deferred shape and initialization) and `ParameterDict`.

A parameter's shape may hold 0 for dimensions learned at the first forward pass (``Dense(256)``
learns its input width); ``initialize`` then records the initializer and the array is made once
the shape is complete. Every change of value bumps a global epoch, so hybridized blocks can tell
cheaply whether their compiled model is stale.

A parameter lives on the contexts given to ``initialize(ctx=...)`` (the current context by
default). The host (numpy) value is the master copy; ``data(gpu(0))`` uploads it once per change
of value and returns that device copy (writes into it are not seen by the master copy).
"""

from __future__ import annotations

import os
import re
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from engine.context import Context, cpu, resolve_context
from engine.errors import EngineError, ShapeError
from engine.gluon import initializer as _init
from engine.nd.ndarray import NDArray
from engine.nd.placement import device_for

_EPOCH = [0]


def parameter_epoch() -> int:
    """A counter bumped whenever any parameter's value or shape changes."""
    return _EPOCH[0]


def _bump() -> int:
    _EPOCH[0] += 1
    return _EPOCH[0]


class DeferredInitializationError(EngineError, RuntimeError):
    """A parameter's shape is not known yet; it is learned at the first forward pass."""


def _known(shape: tuple[int, ...] | None) -> bool:
    return shape is not None and all(dim > 0 for dim in shape)


def contexts(ctx: Any) -> list[Context]:
    """``ctx`` (a context, a list of them, or None for the current one) as a checked list.

    Raises:
        EngineError: a GPU context where CuPy or the GPU is missing.
    """
    found = [resolve_context(one) for one in (ctx if isinstance(ctx, (list, tuple)) else [ctx])]
    if not found:
        raise ValueError("ctx must name at least one context; got an empty list")
    for one in found:
        device_for(one)
    return list(dict.fromkeys(found))


class Parameter:
    """A named parameter array of a Block (weight, bias, BatchNorm statistics, ...).

    Args:
        name: the full name, e.g. ``dense0_weight``.
        shape: dims, 0 where learned at the first forward pass.
        dtype: element type (float32 by default).
        init: initializer (instance or name) used in preference to the one given to
            ``initialize``.
        allow_deferred_init: allow ``initialize`` before the shape is complete.
    """

    def __init__(self, name: str, grad_req: str = "write", shape: Any = None,
                 dtype: Any = np.float32, lr_mult: float = 1.0, wd_mult: float = 1.0,
                 init: Any = None, allow_deferred_init: bool = False,
                 differentiable: bool = True, stype: str = "default",
                 grad_stype: str = "default") -> None:
        self.name = name
        shape = (shape,) if isinstance(shape, int) else shape
        self._shape: tuple[int, ...] | None = None if shape is None else tuple(shape)
        self._declared_shape = self._shape
        self.dtype = np.dtype(dtype)
        self.lr_mult, self.wd_mult = lr_mult, wd_mult
        self.init = init
        self.grad_req = grad_req if differentiable else "null"
        self.allow_deferred_init = allow_deferred_init
        self.stype = stype
        self._data: np.ndarray | None = None
        self._ctx: list[Context] = [cpu()]
        self._copies: dict[Context, tuple[int, NDArray]] = {}  # device copies by version
        self._deferred_init: _init.Initializer | None = None
        self._var: Any = None
        self.version = 0

    def __repr__(self) -> str:
        return f"Parameter {self.name} (shape={self._shape}, dtype={self.dtype.name})"

    # --- shape ---------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...] | None:
        """The shape; 0 marks a dimension not known yet."""
        return self._shape

    @shape.setter
    def shape(self, new_shape: Any) -> None:
        new_shape = tuple(int(dim) for dim in new_shape)
        if self._shape is not None:
            if len(new_shape) != len(self._shape) or any(
                    old and new and old != new for old, new in zip(self._shape, new_shape)):
                raise ShapeError(f"parameter {self.name!r}: shape {new_shape} does not fit the "
                                 f"declared shape {self._shape} (0 marks an unknown dim)")
            new_shape = tuple(new or old for old, new in zip(self._shape, new_shape))
        self._shape = new_shape

    # --- initialization ------------------------------------------------------------------------
    def initialize(self, init: Any = None, ctx: Any = None,
                   default_init: Any = None, force_reinit: bool = False) -> None:
        """Make the array now, or when the shape is complete (``allow_deferred_init``).

        The parameter's own ``init`` wins over ``init``, which wins over ``default_init``
        (``Uniform(0.07)``, as in MXNet). ``ctx`` is a context or a list of them (the current
        context by default); the value is placed on each.

        Raises:
            EngineError: ``ctx`` names a GPU and CuPy or the GPU is missing.
        """
        if self._data is not None and not force_reinit:
            warnings.warn(f"parameter {self.name!r} is already initialized, ignoring; pass "
                          "force_reinit=True to initialize it again", stacklevel=3)
            return
        self.reset_ctx(ctx)
        chosen = _init.create(self.init if self.init is not None else init)
        if chosen is None:
            chosen = _init.create(default_init) or _init.Uniform()
        self._data = None
        if not _known(self._shape):
            if not self.allow_deferred_init:
                raise ShapeError(f"cannot initialize parameter {self.name!r}: its shape "
                                 f"{self._shape} is incomplete; give the full shape (e.g. "
                                 "in_units=/in_channels=) or allow deferred initialization")
            self._deferred_init = chosen
            return
        self._deferred_init = chosen
        self._finish_deferred_init()

    def _finish_deferred_init(self) -> None:
        """Create the array if initialization was deferred and the shape is now complete."""
        if self._deferred_init is None or not _known(self._shape):
            return
        init, self._deferred_init = self._deferred_init, None
        self._set(init(self.name, self._shape, self.dtype))

    def _set(self, array: np.ndarray) -> None:
        self._data = array
        self.version = _bump()

    @property
    def is_deferred(self) -> bool:
        """Whether ``initialize`` was called but the shape is not complete yet."""
        return self._data is None and self._deferred_init is not None

    # --- data ----------------------------------------------------------------------------------
    def data(self, ctx: Any = None) -> NDArray:
        """The value on ``ctx`` (its first context by default) as an NDArray.

        On the CPU the NDArray shares memory with the parameter; on a GPU it is a device copy
        made once per change of value.

        Raises:
            DeferredInitializationError: the shape is learned at the first forward pass.
            EngineError: the parameter was never initialized, or not on ``ctx``.
        """
        if self._data is None:
            if self._deferred_init is not None:
                raise DeferredInitializationError(
                    f"parameter {self.name!r} has not been initialized yet because its shape "
                    f"{self._shape} is learned from the first forward pass; run the block once "
                    "on data (or give in_units/in_channels) before reading it")
            raise EngineError(f"parameter {self.name!r} has not been initialized; call "
                              "block.initialize() (or load_parameters) first")
        ctx = self._ctx[0] if ctx is None else self._check_ctx(resolve_context(ctx))
        if ctx.device_type == "cpu":
            return NDArray(self._data, ctx)
        cached = self._copies.get(ctx)
        if cached is None or cached[0] != self.version:
            cached = self._copies[ctx] = (self.version, NDArray(self._data, ctx))
        return cached[1]

    def _check_ctx(self, ctx: Context) -> Context:
        if ctx not in self._ctx:
            raise EngineError(f"parameter {self.name!r} was not initialized on context {ctx}; "
                              f"it lives on {self._ctx}; initialize the block with ctx={ctx}, "
                              f"call reset_ctx({ctx}), or move the input with "
                              f".as_in_context({self._ctx[0]})")
        return ctx

    def list_data(self) -> list[NDArray]:
        """The value on every context of the parameter, in order."""
        return [self.data(ctx) for ctx in self._ctx]

    def list_ctx(self) -> list[Context]:
        """The contexts the parameter lives on."""
        return list(self._ctx)

    def array(self) -> np.ndarray | None:
        """The value as a numpy array (None when not initialized)."""
        return self._data

    def set_data(self, data: Any) -> None:
        """Replace the value; a deferred shape is completed from ``data``'s shape."""
        array = data.asnumpy() if isinstance(data, NDArray) else np.array(data)
        self.shape = array.shape
        if self._shape != array.shape:
            raise ShapeError(f"parameter {self.name!r}: set_data got shape {array.shape}; "
                             f"expected {self._shape}")
        self._deferred_init = None
        self._set(np.array(array, dtype=self.dtype))

    def cast(self, dtype: Any) -> None:
        """Change the dtype (and the value's dtype)."""
        self.dtype = np.dtype(dtype)
        if self._data is not None:
            self._set(self._data.astype(self.dtype))

    def reset_ctx(self, ctx: Any) -> None:
        """Place the parameter on ``ctx`` (a context or a list; None: the current one).

        Raises:
            EngineError: ``ctx`` names a GPU and CuPy or the GPU is missing.
        """
        self._ctx = contexts(ctx)
        self._copies.clear()

    def zero_grad(self) -> None:
        """Clear gradients (a no-op: this engine does inference only)."""

    def var(self) -> Any:
        """The Symbol variable standing for this parameter (made once, like MXNet's)."""
        if self._var is None:
            from engine import sym

            init = self.init
            self._var = sym.var(self.name, shape=self._declared_shape, dtype=self.dtype,
                                lr_mult=self.lr_mult, wd_mult=self.wd_mult,
                                init=init, stype=self.stype)
        return self._var


class Constant(Parameter):
    """A parameter holding a fixed value (not trained)."""

    def __init__(self, name: str, value: Any) -> None:
        array = value.asnumpy() if isinstance(value, NDArray) else np.asarray(value, np.float32)
        super().__init__(name, grad_req="null", shape=array.shape, dtype=array.dtype,
                         init=_init.Constant(array))
        self._set(array)


class ParameterDict(Mapping[str, Parameter]):
    """Parameters by full name; ``get`` creates ``prefix + name`` on first use."""

    def __init__(self, prefix: str = "", shared: ParameterDict | None = None) -> None:
        self.prefix = prefix
        self._params: OrderedDict[str, Parameter] = OrderedDict()
        self._shared = shared

    def __getitem__(self, key: str) -> Parameter:
        return self._params[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def __repr__(self) -> str:
        body = "\n".join(f"  {param!r}" for param in self._params.values())
        return f"{self.prefix} (\n{body}\n)"

    def get(self, name: str, **kwargs: Any) -> Parameter:  # type: ignore[override]
        """The parameter ``prefix + name``, created with ``kwargs`` if it does not exist."""
        full = self.prefix + name
        param = self._params.get(full)
        if param is None and self._shared is not None:
            param = self._shared._params.get(full)
        if param is None:
            param = Parameter(full, **kwargs)
            self._params[full] = param
        return param

    def update(self, other: Mapping[str, Parameter]) -> None:
        """Add every parameter of ``other`` (names must not clash with different objects)."""
        for name, param in other.items():
            existing = self._params.get(name)
            if existing is not None and existing is not param:
                raise ValueError(f"cannot update ParameterDict: two different parameters are "
                                 f"named {name!r}")
            self._params[name] = param

    def initialize(self, init: Any = None, ctx: Any = None, verbose: bool = False,
                   force_reinit: bool = False) -> None:
        """Initialize every parameter (``init`` is the default for those without their own).

        Raises:
            EngineError: ``ctx`` names a GPU and CuPy or the GPU is missing.
        """
        ctx = contexts(ctx)
        for param in self._params.values():
            param.initialize(None, ctx, default_init=init, force_reinit=force_reinit)

    def setattr(self, name: str, value: Any) -> None:
        """Set an attribute (``grad_req``, ``lr_mult``, ...) on every parameter."""
        for param in self._params.values():
            setattr(param, name, value)

    def reset_ctx(self, ctx: Any) -> None:
        """Place every parameter on ``ctx`` (a context or a list of them)."""
        for param in self._params.values():
            param.reset_ctx(ctx)

    def zero_grad(self) -> None:
        """Clear gradients (a no-op here)."""

    def save(self, filename: str | os.PathLike[str], strip_prefix: str = "") -> None:
        """Write every initialized parameter by name, ``strip_prefix`` removed."""
        from engine.graph.params import save_params

        arrays = {}
        for name, param in self._params.items():
            if not name.startswith(strip_prefix):
                raise ValueError(f"cannot strip prefix {strip_prefix!r} from parameter "
                                 f"{name!r}; it does not start with it")
            arrays[name[len(strip_prefix):]] = param.data().asnumpy()
        save_params(os.fspath(filename), arrays)

    def load(self, filename: str | os.PathLike[str], ctx: Any = None,
             allow_missing: bool = False, ignore_extra: bool = False,
             restore_prefix: str = "", **kwargs: Any) -> None:
        """Load values by name (``arg:``/``aux:`` prefixes accepted); see `assign_arrays`."""
        from engine.graph.params import load_params

        loaded = load_params(os.fspath(filename)).as_dict()
        arrays = {restore_prefix + strip_arg_aux(name): value for name, value in loaded.items()}
        assign_arrays(dict(self._params), arrays, os.fspath(filename), allow_missing,
                      ignore_extra)
        if ctx is not None:
            self.reset_ctx(ctx)


def strip_arg_aux(name: str) -> str:
    """``name`` without an ``arg:``/``aux:`` prefix."""
    return name[4:] if name.startswith(("arg:", "aux:")) else name


def assign_arrays(params: Mapping[str, Parameter], arrays: Mapping[str, Any], source: str,
                  allow_missing: bool, ignore_extra: bool) -> None:
    """Set each parameter from ``arrays`` by key, checking for missing and extra names."""
    if not allow_missing:
        missing = [key for key in params if key not in arrays]
        if missing:
            raise EngineError(f"parameter {missing[0]!r} is missing in {source} "
                              f"({len(missing)} missing; names there look like "
                              f"{', '.join(list(arrays)[:3])}); pass allow_missing=True to "
                              "skip missing parameters")
    if not ignore_extra:
        extra = [key for key in arrays if key not in params]
        if extra:
            raise EngineError(f"{source} has parameter {extra[0]!r}, which the block does not "
                              f"have ({len(extra)} extra; the block's names look like "
                              f"{', '.join(list(params)[:3])}); pass ignore_extra=True to "
                              "skip them")
    for key, param in params.items():
        if key in arrays:
            value = arrays[key]
            param.set_data(value.asnumpy() if isinstance(value, NDArray) else value)


def select_params(params: Mapping[str, Parameter], select: str | None) -> dict[str, Parameter]:
    """The parameters whose full name matches the regular expression ``select``."""
    if select is None:
        return dict(params)
    pattern = re.compile(select)
    return {name: param for name, param in params.items() if pattern.match(name)}
