"""`NDArray`: MXNet's imperative array, a thin wrapper over a NumPy array on the CPU.

Operators run registry kernels right away. Following MXNet, ``a + b`` on two arrays uses the
``broadcast_*`` ops and ``a + 2`` the scalar ops (``_plus_scalar``, ``_rminus_scalar``, ...);
in-place forms (``a += b``) write the result back into ``a``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.context import Context, check_host
from engine.errors import ShapeError
from engine.ops.registry import get_op

_NUMBER = (int, float, np.integer, np.floating, np.bool_, bool)


class NDArray:
    """An n-dimensional array with MXNet's NDArray interface (``asnumpy``, ``shape``, ...)."""

    __slots__ = ("_data", "_ctx")
    __array_priority__ = 1000.0

    def __init__(self, data: np.ndarray, ctx: Context | None = None) -> None:
        self._data = data if isinstance(data, np.ndarray) else np.asarray(data)
        self._ctx = check_host(ctx)

    # --- data access -------------------------------------------------------------------------
    def asnumpy(self) -> np.ndarray:
        """A NumPy copy of the data."""
        return self._data.copy()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
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
        return NDArray(self._data.T.copy(), self._ctx)

    def wait_to_read(self) -> None:
        """Block until the array is computed (computation is synchronous here)."""

    def astype(self, dtype: Any, copy: bool = True) -> NDArray:
        """A copy converted to ``dtype`` (the same array if ``copy=False`` and dtype matches)."""
        if not copy and self._data.dtype == np.dtype(dtype):
            return self
        return NDArray(self._data.astype(dtype), self._ctx)

    def copy(self) -> NDArray:
        """A deep copy."""
        return NDArray(self._data.copy(), self._ctx)

    def copyto(self, other: NDArray | Context) -> NDArray:
        """Copy into another array (shapes must match) or onto a context."""
        if isinstance(other, Context):
            return NDArray(self._data.copy(), other)
        _check_same_shape(other.shape, self.shape, "copyto")
        np.copyto(other._data, self._data, casting="unsafe")
        return other

    def as_in_context(self, ctx: Context) -> NDArray:
        """This array on ``ctx`` (itself when it is already there)."""
        return self if Context(ctx) == self._ctx else self.copyto(ctx)

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
                return NDArray(self._data.reshape(shape), self._ctx)
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
        return f"\n{self._data}\n<NDArray {shape} @{self._ctx}>"

    def __getitem__(self, key: Any) -> NDArray:
        result = self._data[_index(key)]
        if not isinstance(result, np.ndarray) or result.ndim == 0:
            # Legacy MXNet has no 0-d arrays: a single element comes back with shape (1,).
            result = np.asarray(result).reshape(1)
        return NDArray(result, self._ctx)

    def __setitem__(self, key: Any, value: Any) -> None:
        source = value._data if isinstance(value, NDArray) else np.asarray(value)
        try:
            self._data[_index(key)] = source
        except ValueError as error:
            raise ShapeError(f"cannot assign a value of shape {np.shape(source)} to "
                             f"NDArray{list(self.shape)}[{key!r}]: {error}") from None

    # --- arithmetic --------------------------------------------------------------------------
    def __add__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_add", "_plus_scalar")

    __radd__ = __add__

    def __sub__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_sub", "_minus_scalar")

    def __rsub__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_sub", "_rminus_scalar", reflected=True)

    def __mul__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_mul", "_mul_scalar")

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_div", "_div_scalar")

    def __rtruediv__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_div", "_rdiv_scalar", reflected=True)

    def __mod__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_mod", "_mod_scalar")

    def __rmod__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_mod", "_rmod_scalar", reflected=True)

    def __pow__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_power", "_power_scalar")

    def __rpow__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_power", "_rpower_scalar", reflected=True)

    def __neg__(self) -> NDArray:
        return apply_op("_mul_scalar", [self], {"scalar": -1.0})

    def __pos__(self) -> NDArray:
        return self

    def __abs__(self) -> NDArray:
        return apply_op("abs", [self], {})

    def __eq__(self, other: Any) -> NDArray:  # type: ignore[override]
        return _binary(self, other, "broadcast_equal", "_equal_scalar")

    def __ne__(self, other: Any) -> NDArray:  # type: ignore[override]
        return _binary(self, other, "broadcast_not_equal", "_not_equal_scalar")

    def __gt__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_greater", "_greater_scalar")

    def __ge__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_greater_equal", "_greater_equal_scalar")

    def __lt__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_lesser", "_lesser_scalar")

    def __le__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_lesser_equal", "_lesser_equal_scalar")

    def __iadd__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_add", "_plus_scalar", out=self)

    def __isub__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_sub", "_minus_scalar", out=self)

    def __imul__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_mul", "_mul_scalar", out=self)

    def __itruediv__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_div", "_div_scalar", out=self)

    def __imod__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_mod", "_mod_scalar", out=self)

    def __ipow__(self, other: Any) -> NDArray:
        return _binary(self, other, "broadcast_power", "_power_scalar", out=self)


def _index(key: Any) -> Any:
    if isinstance(key, NDArray):
        return key._data.astype(np.int64)
    if isinstance(key, tuple):
        return tuple(_index(part) for part in key)
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


def apply_op(op_name: str, inputs: Sequence[NDArray], attrs: dict[str, Any],
             out: NDArray | Sequence[NDArray] | None = None,
             called_as: str | None = None) -> Any:
    """Run registry op ``op_name`` on NDArrays now; one NDArray, or a list for several outputs."""
    opdef = get_op(op_name)
    parsed = opdef.parse_attrs(attrs, called_as or op_name)
    return run_kernel(opdef, parsed, inputs, out, called_as or op_name)


def run_kernel(opdef: Any, attrs: Any, inputs: Sequence[NDArray],
               out: NDArray | Sequence[NDArray] | None, called_as: str) -> Any:
    """Compute an op on NDArrays with parsed attributes, optionally writing into ``out``."""
    arrays = [array._data for array in inputs]
    ctx = inputs[0]._ctx if inputs else check_host(None)
    results = opdef.compute(np, attrs, arrays)
    wrapped = []
    for result in results:
        result = np.asarray(result)
        if any(result is array for array in arrays):
            result = result.copy()  # identity kernels must not alias their input
        wrapped.append(result)
    if out is not None:
        targets = [out] if isinstance(out, NDArray) else list(out)
        if len(targets) != len(wrapped):
            raise TypeError(f"{called_as}: out= has {len(targets)} arrays; the op has "
                            f"{len(wrapped)} outputs")
        for target, result in zip(targets, wrapped, strict=True):
            _check_same_shape(target.shape, result.shape, f"{called_as} (out=)")
            np.copyto(target._data, result, casting="unsafe")
        return out
    values = [NDArray(result, ctx) for result in wrapped]
    return values[0] if len(values) == 1 else values
