""".params files: every conformance file against its expected arrays, every layout, clear errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import ParamsFormatError
from engine.graph.params import (
    V1_MAGIC,
    V2_MAGIC,
    V3_MAGIC,
    ParamsFile,
    load_params,
    save_params,
    split_arg_aux,
)
from tests.conformance.fixtures import MODELS, PARAMS, model_files, model_names

MODEL_PARAMS = [model_files(name)[1] for name in model_names()]
V3_FILES = {"np_mlp-0000.params", "np_shape_v3.params"}


def _header(count: int) -> bytes:
    return struct.pack("<QQQ", 0x112, 0, count)


def _names(names: list[str] | None) -> bytes:
    names = names or []
    parts = [struct.pack("<Q", len(names))]
    for name in names:
        encoded = name.encode()
        parts += [struct.pack("<Q", len(encoded)), encoded]
    return b"".join(parts)


def _dense(array: np.ndarray, magic: int = V2_MAGIC, code: int = 0) -> bytes:
    dims = struct.pack(f"<i{array.ndim}q", array.ndim, *array.shape)
    body = struct.pack("<iii", 1, 0, code) + np.ascontiguousarray(array).tobytes()
    if magic == V1_MAGIC:
        return struct.pack("<I", magic) + dims + body
    return struct.pack("<Ii", magic, 0) + dims + body


def _file(records: list[bytes], names: list[str] | None = None) -> bytes:
    return _header(len(records)) + b"".join(records) + _names(names)


# --- conformance files ---------------------------------------------------------------------------


def _index() -> dict[str, Any]:
    return json.loads((PARAMS / "index.json").read_text())


@pytest.mark.parametrize("file_name", sorted(_index()))
def test_conformance_params_match_expected(file_name: str) -> None:
    entry = _index()[file_name]
    loaded = load_params(PARAMS / file_name)
    with np.load(PARAMS / entry["expected"].split()[0]) as expected_file:
        expected = {key: expected_file[key] for key in expected_file.files}
    if loaded.names is None:
        actual = {str(position): array for position, array in enumerate(loaded.arrays)}
    else:
        actual = loaded.as_dict()
        if "names" in entry:
            assert loaded.names == entry["names"]
    assert sorted(actual) == sorted(expected)
    for key, want in expected.items():
        got = actual[key]
        assert got.dtype == want.dtype, key
        if got.ndim == 0:  # the .npz stores the 0-d scalar as shape (1,)
            want = want.reshape(())
        assert got.shape == want.shape, key
        np.testing.assert_array_equal(got, want, err_msg=key)


def test_numpy_shape_file_has_scalar_and_zero_size() -> None:
    arrays = load_params(PARAMS / "np_shape_v3.params").as_dict()
    assert arrays["scalar"].shape == () and float(arrays["scalar"]) == 3.5
    assert arrays["zero_size"].shape == (0, 3)


def test_fp16_file_mixes_dtypes() -> None:
    args, auxs = split_arg_aux(load_params(PARAMS / "cnn_fp16-0000.params").as_dict())
    assert args["cnn_fp16_conv0_weight"].dtype == np.float16
    assert args["cnn_fp16_batchnorm0_gamma"].dtype == np.float32
    assert sorted(auxs) == ["cnn_fp16_batchnorm0_running_mean", "cnn_fp16_batchnorm0_running_var"]


@pytest.mark.parametrize("path", MODEL_PARAMS, ids=[path.parent.name for path in MODEL_PARAMS])
def test_model_params_bind_to_graph_variables(path: Path) -> None:
    loaded = load_params(path)
    assert loaded.names is not None
    assert all(name.startswith(("arg:", "aux:")) for name in loaded.names)
    args, auxs = split_arg_aux(loaded.as_dict())
    symbol = json.loads(model_files(path.parent.name)[0].read_text())
    variables = {node["name"]: node.get("attrs", node.get("attr", {}))
                 for node in symbol["nodes"] if node["op"] == "null"}
    for name, array in {**args, **auxs}.items():
        assert name in variables, name
        declared = variables[name].get("__shape__")
        if declared:
            dims = [int(dim) for dim in declared.strip("()").split(",") if dim.strip()]
            assert all(dim in (0, -1, actual) for dim, actual in zip(dims, array.shape)), name
        assert array.flags.writeable and array.flags.aligned


@pytest.mark.parametrize("path", MODEL_PARAMS + [PARAMS / name for name in sorted(_index())],
                         ids=lambda path: path.name)
def test_writing_read_arrays_reproduces_file(path: Path) -> None:
    content = path.read_bytes()
    loaded = load_params(content)
    arrays: Any = loaded.as_dict() if loaded.names is not None else loaded.arrays
    numpy_shape = path.name in V3_FILES
    assert save_params(None, arrays, numpy_shape=numpy_shape) == content


def test_sources_path_bytes_bytearray_memoryview_agree(tmp_path: Path) -> None:
    path = MODELS / "lenet" / "lenet-0000.params"
    content = path.read_bytes()
    reference = load_params(path)
    for source in (str(path), content, bytearray(content), memoryview(content)):
        loaded = load_params(source)
        assert loaded.names == reference.names
        for got, want in zip(loaded.arrays, reference.arrays, strict=True):
            np.testing.assert_array_equal(got, want)
    assert not load_params(content).arrays[0].flags.writeable  # a view into immutable bytes


def test_load_is_zero_copy_into_one_buffer() -> None:
    content = (MODELS / "seed_mlp" / "seed_mlp-0000.params").read_bytes()
    arrays = load_params(content).arrays
    assert all(np.shares_memory(array, np.frombuffer(content, np.uint8)) for array in arrays)


# --- every layout and dtype ----------------------------------------------------------------------

NUMPY_CODES = [(0, "<f4"), (1, "<f8"), (2, "<f2"), (3, "u1"), (4, "<i4"), (5, "i1"), (6, "<i8"),
               (7, "?"), (8, "<i2"), (9, "<u2"), (10, "<u4"), (11, "<u8")]


@pytest.mark.parametrize(("code", "dtype"), NUMPY_CODES)
def test_every_dtype_code_round_trips(code: int, dtype: str) -> None:
    array = (np.arange(12) % 5 - 2).astype(dtype).reshape(3, 4)
    content = save_params(None, {"a": array})
    assert content == _file([_dense(array, code=code)], ["a"])
    (loaded,) = load_params(content).arrays
    assert loaded.dtype == np.dtype(dtype)
    assert loaded.tobytes() == array.tobytes()


def test_bfloat16_is_widened_to_float32() -> None:
    values = np.array([1.0, -2.5, 3.140625, 0.0], dtype=np.float32)
    words = (values.view(np.uint32) >> 16).astype("<u2")
    (loaded,) = load_params(_file([_dense(words, code=12)])).arrays
    assert loaded.dtype == np.float32
    np.testing.assert_array_equal(loaded, values)


def test_v1_and_pre_v1_records() -> None:
    first = np.arange(6, dtype=np.float32).reshape(2, 3)
    second = np.array([7, 8], dtype=np.int32)
    pre_v1 = struct.pack("<I", 1) + struct.pack("<I", 2) + struct.pack("<iii", 1, 0, 4)
    pre_v1 += second.tobytes()
    loaded = load_params(_file([_dense(first, magic=V1_MAGIC), pre_v1], ["a", "b"]))
    np.testing.assert_array_equal(loaded.arrays[0], first)
    np.testing.assert_array_equal(loaded.arrays[1], second)


def test_empty_records_load_as_empty_arrays() -> None:
    v2_none = struct.pack("<Iii", V2_MAGIC, 0, 0)
    v3_none = struct.pack("<Iii", V3_MAGIC, 0, -1)
    v1_none = struct.pack("<Ii", V1_MAGIC, 0)
    pre_v1_none = struct.pack("<I", 0)
    arrays = load_params(_file([v2_none, v3_none, v1_none, pre_v1_none])).arrays
    assert [array.shape for array in arrays] == [(0,)] * 4


def test_zero_size_and_scalar_written_as_v3() -> None:
    content = save_params(None, [np.zeros((0, 3), np.float32), np.float16(1.5)])
    assert content.count(struct.pack("<I", V3_MAGIC)) == 2
    zero, scalar = load_params(content).arrays
    assert zero.shape == (0, 3) and scalar.shape == () and scalar.dtype == np.float16


def test_misaligned_arrays_are_copied_and_aligned() -> None:
    odd = np.array([1, 2, 3], dtype=np.uint8)
    wide = np.array([1.5, 2.5], dtype=np.float64)
    loaded = load_params(save_params(None, [odd, wide])).arrays
    assert loaded[1].flags.aligned
    np.testing.assert_array_equal(loaded[1], wide)


def test_row_sparse_record_is_densified() -> None:
    values = np.array([[1, 2], [3, 4]], dtype=np.float32)
    rows = np.array([1, 3], dtype=np.int64)
    record = struct.pack("<Ii", V2_MAGIC, 1)
    record += struct.pack("<i2q", 2, 2, 2) + struct.pack("<i2q", 2, 4, 2)
    record += struct.pack("<iii", 1, 0, 0) + struct.pack("<i", 6) + struct.pack("<iq", 1, 2)
    record += values.tobytes() + rows.tobytes()
    (dense,) = load_params(_file([record])).arrays
    np.testing.assert_array_equal(dense, [[0, 0], [1, 2], [0, 0], [3, 4]])


def test_csr_record_is_densified() -> None:
    values = np.array([5, 6, 7], dtype=np.float64)
    indptr = np.array([0, 2, 2, 3], dtype=np.int64)
    columns = np.array([0, 3, 1], dtype=np.int64)
    record = struct.pack("<Ii", V2_MAGIC, 2)
    record += struct.pack("<iq", 1, 3) + struct.pack("<i2q", 2, 3, 4)
    record += struct.pack("<iii", 1, 0, 1)
    record += struct.pack("<i", 6) + struct.pack("<iq", 1, 4)
    record += struct.pack("<i", 6) + struct.pack("<iq", 1, 3)
    record += values.tobytes() + indptr.tobytes() + columns.tobytes()
    (dense,) = load_params(_file([record], ["m"])).arrays
    np.testing.assert_array_equal(dense, [[5, 0, 0, 6], [0, 0, 0, 0], [0, 7, 0, 0]])


def test_bad_sparse_indices_raise() -> None:
    record = struct.pack("<Ii", V2_MAGIC, 1)
    record += struct.pack("<iq", 1, 1) + struct.pack("<iq", 1, 4)
    record += struct.pack("<iii", 1, 0, 0) + struct.pack("<i", 6) + struct.pack("<iq", 1, 1)
    record += np.float32(1).tobytes() + np.int64(9).tobytes()
    with pytest.raises(ParamsFormatError, match=r"array #0: row_sparse row index out of range"):
        load_params(_file([record]))


def test_write_then_read_is_bit_identical(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {"arg:w": rng.standard_normal((4, 5)).astype(np.float32),
              "aux:m": np.array([np.nan, -0.0, np.inf], dtype=np.float64),
              "x": rng.integers(-100, 100, (2, 2, 2)).astype(np.int8),
              "big_endian": np.arange(4, dtype=">i4"),
              "strided": np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]}
    path = tmp_path / "out.params"
    content = save_params(path, arrays)
    assert path.read_bytes() == content
    loaded = load_params(path).as_dict()
    for name, array in arrays.items():
        assert loaded[name].shape == array.shape
        assert loaded[name].tobytes() == array.astype(array.dtype.newbyteorder("<")).tobytes()


def test_split_arg_aux() -> None:
    args, auxs = split_arg_aux({"arg:w": 1, "aux:m": 2, "bare": 3, "foo:bar": 4})
    assert args == {"w": 1, "bare": 3, "foo:bar": 4} and auxs == {"m": 2}
    with pytest.raises(ParamsFormatError, match=r"'w' names arg 'w'"):
        split_arg_aux({"arg:w": 1, "w": 2})


def test_as_dict_errors() -> None:
    with pytest.raises(ParamsFormatError, match=r"2 unnamed arrays"):
        load_params(PARAMS / "unnamed_list.params").as_dict()
    duplicated = ParamsFile([np.zeros(1), np.zeros(1)], ["a", "a"])
    with pytest.raises(ParamsFormatError, match=r"name #1 'a' appears twice"):
        duplicated.as_dict()


def test_save_rejects_unsupported_dtype() -> None:
    with pytest.raises(ParamsFormatError, match=r"array 'c' has dtype complex64"):
        save_params(None, {"c": np.zeros(2, np.complex64)})


# --- errors --------------------------------------------------------------------------------------

GOOD = _file([_dense(np.arange(6, dtype=np.float32).reshape(2, 3))], ["w"])


def _patched(offset: int, fmt: str, value: int, base: bytes = GOOD) -> bytes:
    size = struct.calcsize(fmt)
    return base[:offset] + struct.pack(fmt, value) + base[offset + size:]


BAD_FILES = [
    ("wrong list magic", _patched(0, "<Q", 0x113), r"byte offset 0: list header: list magic "
                                                    r"is 0x113; expected 0x112"),
    ("empty file", b"", r"byte offset 0: list header: file ends"),
    ("absurd count", _patched(16, "<Q", 1 << 60),
     r"byte offset 16: .*declares 1152921504606846976 arrays"),
    ("unknown array magic", _patched(24, "<I", 0x12345678),
     r"byte offset 24: array #0: array magic is 0x12345678"),
    ("bad storage type", _patched(28, "<i", 7), r"byte offset 28: array #0: storage type 7"),
    ("negative ndim", _patched(32, "<i", -5), r"byte offset 32: array #0: dimension count -5"),
    ("absurd ndim", _patched(32, "<i", 1000), r"array #0: dimension count 1000"),
    ("negative dim", _patched(36, "<q", -3), r"byte offset 32: array #0: shape \(-3, 3\)"),
    ("absurd dims", _patched(36, "<q", 1 << 40),
     r"array #0: shape \(1099511627776, 3\) of float32 needs 13194139533312 data bytes; only 41"),
    ("unknown dtype", _patched(60, "<i", 42),
     r"byte offset 60: array #0: unknown dtype code 42"),
    ("truncated data", GOOD[:70], r"byte offset 64: array #0: shape \(2, 3\) of float32 needs 24"),
    ("truncated header", GOOD[:40], r"array #0: file ends while reading 2 dimensions"),
    ("no name count", GOOD[:88], r"byte offset 88: name table: file ends"),
    ("name count", _patched(88, "<Q", 2), r"byte offset 88: name table: 2 names for 1 arrays"),
    ("name length", _patched(96, "<Q", 1 << 50), r"byte offset 96: name #0: name length"),
    ("bad utf-8", GOOD[:-1] + b"\xff", r"name #0: name is not valid UTF-8"),
    ("trailing", GOOD + b"\0", r"byte offset 105: after the names: 1 unexpected trailing bytes"),
]


@pytest.mark.parametrize(("case", "content", "message"), BAD_FILES,
                         ids=[case for case, _, _ in BAD_FILES])
def test_bad_files_raise_params_format_error(case: str, content: bytes, message: str) -> None:
    with pytest.raises(ParamsFormatError, match=message):
        load_params(content)


def test_truncation_anywhere_raises() -> None:
    content = (MODELS / "hybridnet" / "hybridnet-0000.params").read_bytes()
    for end in range(len(content)):
        with pytest.raises(ParamsFormatError, match=r"params file, byte offset \d+: "):
            load_params(content[:end])
