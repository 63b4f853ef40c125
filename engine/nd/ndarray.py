"""`NDArray`: MXNet's imperative array, a thin wrapper over a NumPy (CPU) or CuPy (GPU) array.

Operators run registry kernels right away, with the array module of the inputs' context as
``xp``; all inputs of one op must be on the same context. Following MXNet, ``a + b`` on two
arrays uses the ``broadcast_*`` ops and ``a + 2`` the scalar ops (``_plus_scalar``,
``_rminus_scalar``, ...); in-place forms (``a += b``) write the result back into ``a``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.context import Context, resolve_context
from engine.errors import EngineError, ShapeError
from engine.nd import operators
from engine.nd.placement import device_for, host_copy, known_device, move, place, xp_of
from engine.ops.registry import get_op

_NUMBER = (int, float, np.integer, np.floating, np.bool_, bool)


class NDArray:
    """An n-dimensional array with MXNet's NDArray interface (``asnumpy``, ``shape``, ...).

    ``NDArray(data, ctx)`` places ``data`` on ``ctx`` (the current context by default),
    uploading host data to a GPU; the data is not copied when it is already there.

    Raises:
        EngineError: ``ctx`` is a GPU and CuPy or the GPU is missing.
    """

    __slots__ = ("_data", "_ctx")
    __array_priority__ = 1000.0

    def __init__(self, data: Any, ctx: Context | None = None) -> None:
        ctx = resolve_context(ctx)
        self._data = place(data, ctx)
        self._ctx = ctx

    # --- data access -------------------------------------------------------------------------
    def asnumpy(self) -> np.ndarray:
        """A NumPy copy of the data (downloaded from the GPU for a GPU array)."""
        return host_copy(self._data, self._ctx)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if self._ctx.device_type != "cpu":
            data = host_copy(self._data, self._ctx)
            return data if dtype is None else data.astype(dtype, copy=False)
        data = self._data if dtype is None else self._data.astype(dtype, copy=False)
        return data.copy() if copy else data

    def asscalar(self) -> Any:
        """The value of a size-1 array as a Python scalar."""
        if self._data.size != 1:
            raise ValueError(f"asscalar needs an array of size 1, got shape {self.shape}")
        return self._data.item()

    def item(self) -> Any:
        """The value of a size-1 array as a Python scalar."""
        return self.asscalar()

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return self._data.shape

    @property
    def dtype(self) -> type:
        """The element type, as a NumPy scalar type (``numpy.float32``), like MXNet."""
        return self._data.dtype.type

    @property
    def context(self) -> Context:
        """The device the array lives on."""
        return self._ctx

    ctx = context

    @property
    def size(self) -> int:
        """Number of elements."""
        return self._data.size

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return self._data.ndim

    @property
    def T(self) -> NDArray:  # noqa: N802 - MXNet's spelling
        """The transpose (axes reversed)."""
        return wrap(self._data.T.copy(), self._ctx)

    def wait_to_read(self) -> None:
        """Block until the array is computed (waits for its GPU's queued work)."""
        known_device(self._ctx).synchronize()

    def astype(self, dtype: Any, copy: bool = True) -> NDArray:
        """A copy converted to ``dtype`` (the same array if ``copy=False`` and dtype matches)."""
        if not copy and self._data.dtype == np.dtype(dtype):
            return self
        return wrap(self._data.astype(dtype), self._ctx)

    def copy(self) -> NDArray:
        """A deep copy (on the same context)."""
        return wrap(self._data.copy(), self._ctx)

    def copyto(self, other: NDArray | Context) -> NDArray:
        """Copy into another array (shapes must match, any context) or onto a context.

        Raises:
            EngineError: the target is a GPU and CuPy or the GPU is missing.
        """
        if isinstance(other, Context):
            device_for(other)
            return wrap(move(self._data, self._ctx, other), other)
        _check_same_shape(other.shape, self.shape, "copyto")
        source = self._data if other._ctx == self._ctx else move(self._data, self._ctx,
                                                                other._ctx)
        xp_of(other._ctx).copyto(other._data, source, casting="unsafe")
        return other

    def as_in_context(self, ctx: Context) -> NDArray:
        """This array on ``ctx`` (itself when it is already there)."""
        return self if Context(ctx) == self._ctx else self.copyto(Context(ctx))

    def reshape(self, *shape: Any, reverse: bool = False, **kwargs: Any) -> NDArray:
        """Reshape with MXNet's codes (0 copy, -1 infer, -2 rest, -3 merge, -4 split)."""
        if "shape" in kwargs:
            shape = (kwargs.pop("shape"),)
        if kwargs:
            raise TypeError(f"reshape got unexpected arguments {sorted(kwargs)}")
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if not reverse and all(dim > 0 or dim == -1 for dim in shape):
            try:
                return wrap(self._data.reshape(shape), self._ctx)
            except ValueError as error:
                raise ShapeError(
                    f"cannot reshape {self.shape} to {tuple(shape)}: {error}") from None
        return apply_op("Reshape", [self], {"shape": tuple(shape), "reverse": reverse})

    # --- Python protocol ---------------------------------------------------------------------
    def __len__(self) -> int:
        if not self._data.ndim:
            raise TypeError("len() of a 0-d NDArray")
        return self._data.shape[0]

    def __bool__(self) -> bool:
        if self._data.size == 1:
            return bool(self._data.item())
        if self._data.size == 0:
            return False
        raise ValueError(f"the truth value of an NDArray with {self._data.size} elements is "
                         "ambiguous; use (x != 0).sum() or compare a single element")

    def __iter__(self) -> Any:
        return (self[index] for index in range(len(self)))

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        shape = "x".join(str(dim) for dim in self.shape)
        return f"\n{self.asnumpy()}\n<NDArray {shape} @{self._ctx}>"

    def __getitem__(self, key: Any) -> NDArray:
        result = self._data[_index(key, self._ctx)]
        if getattr(result, "ndim", 0) == 0:
            # Legacy MXNet has no 0-d arrays: a single element comes back with shape (1,).
            result = xp_of(self._ctx).asarray(result).reshape(1)
        return wrap(result, self._ctx)

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, NDArray):
            source = value._data if value._ctx == self._ctx else move(value._data, value._ctx,
                                                                      self._ctx)
        else:
            source = np.asarray(value) if self._ctx.device_type == "cpu" else place(value,
                                                                                    self._ctx)
        try:
            self._data[_index(key, self._ctx)] = source
        except ValueError as error:
            raise ShapeError(f"cannot assign a value of shape {np.shape(source)} to "
                             f"NDArray{list(self.shape)}[{key!r}]: {error}") from None

    # --- arithmetic (the binary and in-place operators: `operators.add_operators` below) ----
    def __neg__(self) -> NDArray:
        return apply_op("_mul_scalar", [self], {"scalar": -1.0})

    def __pos__(self) -> NDArray:
        return self

    def __abs__(self) -> NDArray:
        return apply_op("abs", [self], {})


def wrap(data: Any, ctx: Context) -> NDArray:
    """An NDArray around ``data``, which must already be an array on ``ctx`` (not checked)."""
    array = NDArray.__new__(NDArray)
    array._data = data
    array._ctx = ctx
    return array


def _index(key: Any, ctx: Context) -> Any:
    if isinstance(key, NDArray):
        indices = key._data if key._ctx == ctx else move(key._data, key._ctx, ctx)
        return indices.astype(np.int64)
    if isinstance(key, tuple):
        return tuple(_index(part, ctx) for part in key)
    return key


def _check_same_shape(target: tuple[int, ...], result: tuple[int, ...], what: str) -> None:
    if tuple(target) != tuple(result):
        raise ShapeError(f"{what}: the output array has shape {tuple(target)} but the result "
                         f"has shape {tuple(result)}")


def _binary(array: NDArray, other: Any, array_op: str, scalar_op: str,
            reflected: bool = False, out: NDArray | None = None) -> NDArray:
    if isinstance(other, NDArray):
        inputs = [other, array] if reflected else [array, other]
        return apply_op(array_op, inputs, {}, out)
    if isinstance(other, np.ndarray):
        other_array = NDArray(other.astype(array._data.dtype, copy=False), array._ctx)
        inputs = [other_array, array] if reflected else [array, other_array]
        return apply_op(array_op, inputs, {}, out)
    if isinstance(other, _NUMBER):
        return apply_op(scalar_op, [array], {"scalar": other}, out)
    return NotImplemented


# MXNet's NDArray operators broadcast: ``a + b`` is ``broadcast_add``.
_OPS = {
    "add": ("broadcast_add", "_plus_scalar", "_plus_scalar"),
    "sub": ("broadcast_sub", "_minus_scalar", "_rminus_scalar"),
    "mul": ("broadcast_mul", "_mul_scalar", "_mul_scalar"),
    "div": ("broadcast_div", "_div_scalar", "_rdiv_scalar"),
    "mod": ("broadcast_mod", "_mod_scalar", "_rmod_scalar"),
    "pow": ("broadcast_power", "_power_scalar", "_rpower_scalar"),
    "equal": ("broadcast_equal", "_equal_scalar", "_equal_scalar"),
    "not_equal": ("broadcast_not_equal", "_not_equal_scalar", "_not_equal_scalar"),
    "greater": ("broadcast_greater", "_greater_scalar", "_greater_scalar"),
    "greater_equal": ("broadcast_greater_equal", "_greater_equal_scalar",
                      "_greater_equal_scalar"),
    "lesser": ("broadcast_lesser", "_lesser_scalar", "_lesser_scalar"),
    "lesser_equal": ("broadcast_lesser_equal", "_lesser_equal_scalar", "_lesser_equal_scalar"),
}


def _in_place(method: str, operation: str, spelling: str) -> Any:
    """``a op= b`` writes the result into ``a``."""
    array_op, scalar_op, _ = _OPS[operation]

    def update(self: NDArray, other: Any) -> NDArray:
        return _binary(self, other, array_op, scalar_op, out=self)

    update.__name__ = update.__qualname__ = method
    return update


operators.add_operators(NDArray, _OPS, _binary, _in_place)


def apply_op(op_name: str, inputs: Sequence[NDArray], attrs: dict[str, Any],
             out: NDArray | Sequence[NDArray] | None = None,
             called_as: str | None = None) -> Any:
    """Run registry op ``op_name`` on NDArrays now; one NDArray, or a list for several outputs."""
    opdef = get_op(op_name)
    parsed = opdef.parse_attrs(attrs, called_as or op_name)
    return run_kernel(opdef, parsed, inputs, out, called_as or op_name)


def run_kernel(opdef: Any, attrs: Any, inputs: Sequence[NDArray],
               out: NDArray | Sequence[NDArray] | None, called_as: str,
               ctx: Context | None = None) -> Any:
    """Compute an op on NDArrays with parsed attributes, optionally writing into ``out``.

    The kernel runs with the inputs' array module; ``ctx`` places an op without inputs (the
    current context by default).

    Raises:
        EngineError: the inputs are on different contexts.
    """
    arrays = [array._data for array in inputs]
    if inputs:
        ctx = _common_context(opdef, attrs, inputs, called_as)
    else:
        ctx = resolve_context(ctx)
        device_for(ctx)
    xp = np if ctx.device_type == "cpu" else known_device(ctx).xp
    if xp is np:
        results = opdef.compute(np, attrs, arrays)
    else:
        with known_device(ctx).activate():
            results = opdef.compute(xp, attrs, arrays)
    wrapped = []
    for result in results:
        # Identity kernels must not alias their input (checked before asarray, which may view).
        aliased = any(result is array for array in arrays)
        result = xp.asarray(result)
        wrapped.append(result.copy() if aliased else result)
    if out is not None:
        _write_out(out, wrapped, ctx, called_as)
        return out
    values = [wrap(result, ctx) for result in wrapped]
    return values[0] if len(values) == 1 else values


def _common_context(opdef: Any, attrs: Any, inputs: Sequence[NDArray],
                    called_as: str) -> Context:
    """The context shared by all inputs; an error naming the first input that differs."""
    ctx = inputs[0]._ctx
    for position, array in enumerate(inputs):
        if array._ctx is not ctx and array._ctx != ctx:
            try:
                names = list(opdef.input_names(attrs))
            except Exception:  # noqa: BLE001 - names only improve the message
                names = []
            first, other = (names[index] if index < len(names) else f"#{index}"
                            for index in (0, position))
            raise EngineError(
                f"{called_as}: input {other!r} is on {array._ctx} but input {first!r} is on "
                f"{ctx}; all inputs of one op must be on the same context (move them with "
                f".as_in_context({ctx}))")
    return ctx


def _write_out(out: NDArray | Sequence[NDArray], results: list[Any], ctx: Context,
               called_as: str) -> None:
    targets = [out] if isinstance(out, NDArray) else list(out)
    if len(targets) != len(results):
        raise TypeError(f"{called_as}: out= has {len(targets)} arrays; the op has "
                        f"{len(results)} outputs")
    for target, result in zip(targets, results, strict=True):
        _check_same_shape(target.shape, result.shape, f"{called_as} (out=)")
        if target._ctx != ctx:
            result = move(result, ctx, target._ctx)
        xp_of(target._ctx).copyto(target._data, result, casting="unsafe")
