"""MXNet ``.params`` files: read every record layout MXNet ever wrote, write what 1.9.1 writes.

Reading makes one pass over one buffer: dense arrays are `numpy.frombuffer` views into it (a copy
only where an array's offset is misaligned for its dtype), so loading costs about as much as
reading the file. Views into a ``bytes`` source are read-only; a file read from a path is read
into a writable buffer. Every size is checked against the bytes that remain before anything is
allocated, and every problem raises `ParamsFormatError` naming the byte offset and the array.

Writing uses the V2 record (dense, context cpu(0)) for every array except 0-d and zero-size
arrays, which use the V3 record as MXNet does in numpy-shape mode (V2 cannot represent them: its
``ndim == 0`` means "no array" and its zero dimension means "unknown").
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ParamsFormatError

LIST_MAGIC = 0x112
V1_MAGIC = 0xF993FAC8
V2_MAGIC = 0xF993FAC9
V3_MAGIC = 0xF993FACA
BFLOAT16 = 12
DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"), 1: np.dtype("<f8"), 2: np.dtype("<f2"), 3: np.dtype("u1"),
    4: np.dtype("<i4"), 5: np.dtype("i1"), 6: np.dtype("<i8"), 7: np.dtype("?"),
    8: np.dtype("<i2"), 9: np.dtype("<u2"), 10: np.dtype("<u4"), 11: np.dtype("<u8"),
    BFLOAT16: np.dtype("<u2"),  # raw 16-bit words, widened to float32 on load
}
DTYPE_CODES: dict[np.dtype, int] = {dtype: code for code, dtype in DTYPES.items()
                                    if code != BFLOAT16}
STORAGE_DENSE, STORAGE_ROW_SPARSE, STORAGE_CSR = 0, 1, 2
_AUX_COUNT = {STORAGE_ROW_SPARSE: 1, STORAGE_CSR: 2}
MAX_NDIM = 32
MAX_DIM = 1 << 48
MAX_SPARSE_DENSE_BYTES = 1 << 32


@dataclass
class ParamsFile:
    """The arrays of a ``.params`` file, in file order, and their names (None if saved unnamed).

    An empty ("none") array record loads as a float32 array of shape ``(0,)``.
    """

    arrays: list[np.ndarray]
    names: list[str] | None

    def as_dict(self) -> dict[str, np.ndarray]:
        """Raw names (``arg:``/``aux:`` prefixes kept) mapped to arrays.

        Raises:
            ParamsFormatError: the file has no names, or a name appears twice.
        """
        if self.names is None:
            if not self.arrays:
                return {}
            raise ParamsFormatError(f"params file holds {len(self.arrays)} unnamed arrays "
                                    "(saved from a list); read them by position from .arrays")
        result: dict[str, np.ndarray] = {}
        for index, (name, array) in enumerate(zip(self.names, self.arrays, strict=True)):
            if name in result:
                raise ParamsFormatError(f"params file: name #{index} {name!r} appears twice")
            result[name] = array
        return result


def split_arg_aux(arrays: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``arg:``/``aux:`` names into (args, auxs) with prefixes removed; bare names are args.

    Raises:
        ParamsFormatError: two names map to the same variable within args or within auxs.
    """
    args: dict[str, Any] = {}
    auxs: dict[str, Any] = {}
    for name, value in arrays.items():
        if name.startswith("aux:"):
            target, bare = auxs, name[4:]
        else:
            target, bare = args, name[4:] if name.startswith("arg:") else name
        if bare in target:
            kind = "aux" if target is auxs else "arg"
            raise ParamsFormatError(f"params: {name!r} names {kind} {bare!r}, which another "
                                    "entry already names")
        target[bare] = value
    return args, auxs


def load_params(source: str | os.PathLike[str] | bytes | bytearray | memoryview) -> ParamsFile:
    """Read a ``.params`` file from a path or from its bytes.

    Raises:
        ParamsFormatError: naming the byte offset and the array for a wrong magic, truncation,
            an unknown dtype, bad or absurd dimensions, a bad name table or trailing bytes.
        OSError: the path cannot be read.
    """
    if isinstance(source, (str, os.PathLike)):
        buffer: Any = _read_file(source)
    elif isinstance(source, memoryview):
        buffer = source.cast("B") if source.c_contiguous else source.tobytes()
    elif isinstance(source, (bytes, bytearray)):
        buffer = source
    else:
        raise TypeError(f"params source must be a path or bytes; got {type(source).__name__}")
    return _Reader(buffer).read_file()


def _read_file(path: str | os.PathLike[str]) -> np.ndarray:
    with open(path, "rb", buffering=0) as stream:
        size = os.fstat(stream.fileno()).st_size
        buffer = np.empty(size, dtype=np.uint8)  # not zero-filled: readinto overwrites it
        view = memoryview(buffer)
        done = 0
        while done < size:
            count = stream.readinto(view[done:])
            if not count:
                break
            done += count
    return buffer[:done]


class _Reader:
    """A cursor over one buffer; every read checks that the bytes are there."""

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer
        self.size = len(buffer) if not isinstance(buffer, np.ndarray) else buffer.size
        self.offset = 0
        self.where = "list header"

    def fail(self, what: str, offset: int | None = None) -> ParamsFormatError:
        at = self.offset if offset is None else offset
        return ParamsFormatError(f"params file, byte offset {at}: {self.where}: {what}")

    def unpack(self, fmt: str, what: str) -> tuple[int, ...]:
        size = struct.calcsize(fmt)
        if self.offset + size > self.size:
            raise self.fail(f"file ends while reading {what} ({size} bytes needed, "
                            f"{self.size - self.offset} left); the file is truncated")
        values = struct.unpack_from(fmt, self.buffer, self.offset)
        self.offset += size
        return values

    def read_file(self) -> ParamsFile:
        magic, _reserved, count = self.unpack("<QQQ", "the list header")
        if magic != LIST_MAGIC:
            raise self.fail(f"list magic is {magic:#x}; expected {LIST_MAGIC:#x} "
                            "(not an MXNet .params file)", 0)
        if count > (self.size - self.offset) // 4:
            raise self.fail(f"declares {count} arrays, more than the "
                            f"{self.size - self.offset} bytes left could hold", 16)
        arrays = []
        for index in range(count):
            self.where = f"array #{index}"
            arrays.append(self.record())
        names = self.names(count)
        if self.offset != self.size:
            self.where = "after the names"
            raise self.fail(f"{self.size - self.offset} unexpected trailing bytes")
        return ParamsFile(arrays, names)

    def names(self, count: int) -> list[str] | None:
        self.where = "name table"
        (declared,) = self.unpack("<Q", "the name count")
        if declared not in (0, count):
            raise self.fail(f"{declared} names for {count} arrays; expected 0 or {count}",
                            self.offset - 8)
        if declared == 0:
            return None
        names = []
        for index in range(declared):
            self.where = f"name #{index}"
            (length,) = self.unpack("<Q", "the name length")
            if length > self.size - self.offset:
                raise self.fail(f"name length {length} runs past the end of the file "
                                f"({self.size - self.offset} bytes left)", self.offset - 8)
            raw = bytes(self.buffer[self.offset:self.offset + length])
            try:
                names.append(raw.decode("utf-8"))
            except UnicodeDecodeError as error:
                raise self.fail(f"name is not valid UTF-8 ({error.reason} at byte "
                                f"{error.start} of the name)") from None
            self.offset += length
        return names

    def record(self) -> np.ndarray:
        start = self.offset
        (magic,) = self.unpack("<I", "the array magic")
        if magic in (V2_MAGIC, V3_MAGIC):
            numpy_shape = magic == V3_MAGIC
            (storage,) = self.unpack("<i", "the storage type")
            if storage not in (STORAGE_DENSE, STORAGE_ROW_SPARSE, STORAGE_CSR):
                raise self.fail(f"storage type {storage}; expected 0 (dense), 1 (row_sparse) "
                                "or 2 (csr)", self.offset - 4)
            if storage != STORAGE_DENSE:
                return self.sparse(storage, numpy_shape)
            shape = self.shape64(numpy_shape)
        elif magic == V1_MAGIC:
            shape = self.shape64(False)
        else:
            shape = self.shape32(magic, start)
        if shape is None:
            return np.zeros((0,), dtype=np.float32)
        self.unpack("<ii", "the context")
        dtype_code = self.dtype_code()
        return self.data(dtype_code, shape)

    def shape64(self, numpy_shape: bool) -> tuple[int, ...] | None:
        at = self.offset
        (ndim,) = self.unpack("<i", "the dimension count")
        if ndim == -1 or (ndim == 0 and not numpy_shape):
            return None  # an empty ("none") array: the record ends here
        if not 0 <= ndim <= MAX_NDIM:
            raise self.fail(f"dimension count {ndim}; expected 0..{MAX_NDIM} "
                            "(or -1 for an empty array)", at)
        dims = self.unpack(f"<{ndim}q", f"{ndim} dimensions")
        return self.check_dims(dims, at)

    def shape32(self, ndim: int, at: int) -> tuple[int, ...] | None:
        # Files before V1 have no magic: the first word is the dimension count itself.
        if ndim > MAX_NDIM:
            raise self.fail(f"array magic is {ndim:#x}; expected {V2_MAGIC:#x} (V2), "
                            f"{V3_MAGIC:#x} (V3), {V1_MAGIC:#x} (V1) or a pre-V1 dimension "
                            f"count up to {MAX_NDIM}", at)
        if ndim == 0:
            return None
        return self.check_dims(self.unpack(f"<{ndim}I", f"{ndim} dimensions"), at)

    def check_dims(self, dims: Sequence[int], at: int) -> tuple[int, ...]:
        size = 1
        for dim in dims:
            if not 0 <= dim <= MAX_DIM:
                raise self.fail(f"shape {tuple(dims)} has dimension {dim}; expected 0..{MAX_DIM}",
                                at)
            size *= max(dim, 1)
        if size > MAX_DIM:
            raise self.fail(f"shape {tuple(dims)} is absurdly large", at)
        return tuple(dims)

    def dtype_code(self) -> int:
        (code,) = self.unpack("<i", "the dtype code")
        if code not in DTYPES:
            raise self.fail(f"unknown dtype code {code}; expected 0..12", self.offset - 4)
        return code

    def data(self, code: int, shape: tuple[int, ...]) -> np.ndarray:
        dtype = DTYPES[code]
        count = 1
        for dim in shape:
            count *= dim
        nbytes = count * dtype.itemsize
        if nbytes > self.size - self.offset:
            raise self.fail(f"shape {shape} of {_dtype_name(code)} needs {nbytes} data bytes; "
                            f"only {self.size - self.offset} are left (truncated file?)")
        array = np.frombuffer(self.buffer, dtype=dtype, count=count, offset=self.offset)
        self.offset += nbytes
        if not array.flags.aligned:
            array = array.copy()
        array = array.reshape(shape)
        if code == BFLOAT16:
            array = (array.astype(np.uint32) << 16).view(np.float32)
        return array

    def sparse(self, storage: int, numpy_shape: bool) -> np.ndarray:
        at = self.offset
        storage_shape = self.shape64(numpy_shape)
        shape = self.shape64(numpy_shape)
        if shape is None:
            return np.zeros((0,), dtype=np.float32)
        if storage_shape is None:
            raise self.fail("sparse array has no storage shape", at)
        self.unpack("<ii", "the context")
        code = self.dtype_code()
        aux_headers = []
        for _ in range(_AUX_COUNT[storage]):
            aux_code = self.dtype_code()
            if not np.issubdtype(DTYPES[aux_code], np.integer) or aux_code == BFLOAT16:
                raise self.fail(f"sparse index dtype {_dtype_name(aux_code)} is not an integer "
                                "type", self.offset - 4)
            aux_shape = self.shape64(numpy_shape)
            aux_headers.append((aux_code, (0,) if aux_shape is None else aux_shape))
        values = self.data(code, storage_shape)
        aux = [self.data(aux_code, aux_shape) for aux_code, aux_shape in aux_headers]
        dense_bytes = int(np.prod(shape, dtype=object)) * values.dtype.itemsize
        if dense_bytes > MAX_SPARSE_DENSE_BYTES:
            raise self.fail(f"sparse array of shape {shape} would need {dense_bytes} bytes as "
                            f"a dense array (limit {MAX_SPARSE_DENSE_BYTES})", at)
        if storage == STORAGE_ROW_SPARSE:
            return self.densify_rows(shape, values, aux[0], at)
        return self.densify_csr(shape, values, aux[0], aux[1], at)

    def densify_rows(self, shape: tuple[int, ...], values: np.ndarray, rows: np.ndarray,
                     at: int) -> np.ndarray:
        if not shape or rows.shape != values.shape[:1] or values.shape[1:] != shape[1:]:
            raise self.fail(f"row_sparse layout: values {values.shape} with row indices "
                            f"{rows.shape} do not fit shape {shape}", at)
        if rows.size and (rows.min() < 0 or rows.max() >= shape[0]):
            raise self.fail(f"row_sparse row index out of range 0..{shape[0] - 1}", at)
        dense = np.zeros(shape, dtype=values.dtype)
        dense[rows.astype(np.int64)] = values
        return dense

    def densify_csr(self, shape: tuple[int, ...], values: np.ndarray, indptr: np.ndarray,
                    columns: np.ndarray, at: int) -> np.ndarray:
        if (len(shape) != 2 or values.ndim != 1 or indptr.shape != (shape[0] + 1,)
                or columns.shape != values.shape):
            raise self.fail(f"csr layout: values {values.shape}, indptr {indptr.shape} and "
                            f"column indices {columns.shape} do not fit shape {shape}", at)
        pointers = indptr.astype(np.int64)
        if (pointers[0] != 0 or pointers[-1] != values.size
                or bool(np.any(np.diff(pointers) < 0))):
            raise self.fail("csr indptr must start at 0, never decrease and end at the number "
                            "of stored values", at)
        if columns.size and (columns.min() < 0 or columns.max() >= shape[1]):
            raise self.fail(f"csr column index out of range 0..{shape[1] - 1}", at)
        dense = np.zeros(shape, dtype=values.dtype)
        rows = np.repeat(np.arange(shape[0]), np.diff(pointers))
        dense[rows, columns.astype(np.int64)] = values
        return dense


def _dtype_name(code: int) -> str:
    return "bfloat16" if code == BFLOAT16 else DTYPES[code].name


def save_params(target: str | os.PathLike[str] | None,
                arrays: Mapping[str, Any] | Sequence[Any], *, numpy_shape: bool = False) -> bytes:
    """Write arrays as MXNet 1.9.1 does (V2 dense records, context cpu(0)); return the bytes.

    A dict writes its keys as names (give ``arg:``/``aux:`` prefixes yourself for a model); a
    list writes no names. 0-d and zero-size arrays are written as V3 records (numpy-shape mode);
    ``numpy_shape=True`` writes every record as V3, as MXNet does under ``npx.set_np()``.

    Raises:
        ParamsFormatError: a name is not a string or an array's dtype has no MXNet code.
    """
    if isinstance(arrays, Mapping):
        names: list[str] = []
        for name in arrays:
            if not isinstance(name, str):
                raise ParamsFormatError(f"save_params: names must be strings; got {name!r}")
            names.append(name)
        values = list(arrays.values())
    else:
        names, values = [], list(arrays)
    parts: list[Any] = [struct.pack("<QQQ", LIST_MAGIC, 0, len(values))]
    for index, value in enumerate(values):
        label = repr(names[index]) if names else f"#{index}"
        parts.extend(_record_parts(np.asarray(value), label, numpy_shape))
    parts.append(struct.pack("<Q", len(names)))
    for name in names:
        encoded = name.encode("utf-8")
        parts.append(struct.pack("<Q", len(encoded)))
        parts.append(encoded)
    content = b"".join(parts)
    if target is not None:
        Path(target).write_bytes(content)
    return content


def _record_parts(array: np.ndarray, label: str, numpy_shape: bool) -> list[Any]:
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    code = DTYPE_CODES.get(dtype)
    if code is None:
        supported = ", ".join(sorted({d.name for d in DTYPE_CODES}))
        raise ParamsFormatError(f"save_params: array {label} has dtype {array.dtype}, which "
                                f".params files cannot store; supported: {supported}")
    if array.dtype != dtype or not array.flags.c_contiguous:
        array = np.array(array, dtype=dtype, order="C")  # (ascontiguousarray makes 0-d 1-d)
    magic = V3_MAGIC if numpy_shape or array.ndim == 0 or array.size == 0 else V2_MAGIC
    header = struct.pack(f"<Iii{array.ndim}qiii", magic, STORAGE_DENSE, array.ndim,
                         *array.shape, 1, 0, code)
    return [header, memoryview(array.reshape(-1).view(np.uint8))]
