"""config.json schema, manifests and names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.serving.config import ModelConfig, VersionPolicy, datatype_of, parse_config
from engine.serving.errors import InvalidModel, InvalidName
from engine.serving.manifest import (
    MANIFEST_NAME,
    PARAMS_NAME,
    SYMBOL_NAME,
    read_manifest,
    verify_manifest,
    write_manifest,
)
from engine.serving.names import check_model_name, check_version, is_version_dir_name

FULL = {
    "name": "mlp",
    "max_batch_size": 16,
    "inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, 512]}],
    "outputs": [{"name": "out", "datatype": "float16", "shape": [-1, 2]}],
    "dynamic_batching": {"max_queue_delay_us": 500, "preferred_batch_sizes": [8, 4, 8],
                         "max_queue_size": 100, "timeout_us": 2_000_000},
    "device": "cpu",
    "version_policy": {"specific": {"versions": [1, 2]}},
}


def test_full_config_parses_and_normalises() -> None:
    config = parse_config(json.dumps(FULL), "config.json")
    assert config.inputs is not None and config.inputs[0].dtype == np.dtype(np.float32)
    assert config.outputs is not None and config.outputs[0].datatype == "FP16"
    assert config.dynamic_batching.preferred_batch_sizes == (4, 8)
    assert config.version_policy.select([3, 2, 1]) == [1, 2]
    assert parse_config(config.to_json(), "again") == config


def test_empty_config_takes_defaults() -> None:
    config = parse_config(b"{}", "config.json")
    assert config.inputs is None and config.max_batch_size == 32
    assert config.version_policy.select([1, 5, 3]) == [5]


@pytest.mark.parametrize("change, field", [
    ({"max_batch_size": -1}, "max_batch_size"),
    ({"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 512]}]}, "inputs.0.shape"),
    ({"inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, 0]}]}, "inputs.0.shape"),
    ({"inputs": [{"name": "data", "datatype": "COMPLEX", "shape": [-1]}]}, "inputs.0.datatype"),
    ({"outputs": [{"name": "o", "datatype": "FP32", "shape": [-1]}] * 2}, "names must be unique"),
    ({"dynamic_batching": {"preferred_batch_sizes": [64]}}, "exceed max_batch_size"),
    ({"dynamic_batching": {"max_queue_delay_us": -1}}, "dynamic_batching.max_queue_delay_us"),
    ({"dynamic_batching": {"timeout_us": 0}}, "dynamic_batching.timeout_us"),
    ({"device": "tpu"}, "device"),
    ({"version_policy": {"latest": {}, "all": {}}}, "exactly one"),
    ({"version_policy": {"specific": {"versions": [0]}}}, "version_policy.specific.versions"),
    ({"batch": 3}, "batch: Extra inputs are not permitted"),
    ({"max_batch_size": True}, "max_batch_size: Input should be a valid integer"),
    ({"max_batch_size": 8.0}, "max_batch_size: Input should be a valid integer"),
    ({"inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, "512"]}]}, "inputs.0.shape.1"),
    ({"instance_group": [{"count": 0}]}, "instance_group.0.count"),
    ({"instance_group": [{"count": 2.0}]}, "instance_group.0.count"),
    ({"instance_group": [{"kind": "KIND_CPU"}]}, "instance_group.0.count: Field required"),
    ({"instance_group": [{"count": 2, "kind": "KIND_TPU"}]}, "instance_group.0.kind"),
    ({"instance_group": [{"count": 2, "kind": "KIND_GPU"}]}, "device is 'cpu'"),
    ({"instance_group": [{"count": 1}, {"count": 1}]}, "instance_group: give one group"),
    ({"instance_group": []}, "instance_group: give one group"),
])
def test_invalid_config_names_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidModel) as caught:
        parse_config({**FULL, **change}, "REPO/mlp/config.json")
    assert str(caught.value).startswith("REPO/mlp/config.json: ")
    assert field in str(caught.value)


@pytest.mark.parametrize("data", [b"{", b"[1]", b"\xff"])
def test_config_that_is_not_a_json_object_is_refused(data: bytes) -> None:
    with pytest.raises(InvalidModel, match="config"):
        parse_config(data, "upload")


def test_version_policies() -> None:
    assert VersionPolicy.model_validate({"latest": {"num_versions": 2}}).select([1, 4, 2]) == [2, 4]
    assert VersionPolicy.model_validate({"all": {}}).select([2, 1]) == [1, 2]
    assert ModelConfig().version_policy.select([]) == []


def test_datatype_mapping() -> None:
    assert datatype_of(np.float32) == "FP32" and datatype_of("int64") == "INT64"
    with pytest.raises(ValueError, match="no V2 datatype"):
        datatype_of(np.complex64)


def test_manifest_round_trip_and_mismatches(tmp_path: Path) -> None:
    (tmp_path / SYMBOL_NAME).write_bytes(b"{}")
    (tmp_path / PARAMS_NAME).write_bytes(b"weights")
    assert read_manifest(tmp_path) is None
    written = write_manifest(tmp_path)
    read = read_manifest(tmp_path)
    assert read == written and {entry.name for entry in read.files} == {SYMBOL_NAME, PARAMS_NAME}
    verify_manifest(tmp_path, read)
    (tmp_path / PARAMS_NAME).write_bytes(b"weightz")
    with pytest.raises(InvalidModel, match="sha256"):
        verify_manifest(tmp_path, read)
    (tmp_path / PARAMS_NAME).write_bytes(b"w")
    with pytest.raises(InvalidModel, match="size 1 bytes"):
        verify_manifest(tmp_path, read)
    (tmp_path / PARAMS_NAME).unlink()
    with pytest.raises(InvalidModel, match="missing"):
        verify_manifest(tmp_path, read)


@pytest.mark.parametrize("content", [
    b"nope", b'{"format": 1}', b'{"format": 2, "files": []}',
    b'{"format": 1, "files": [{"name": "../x", "size": 1, "sha256": "' + b"0" * 64 + b'"}]}',
])
def test_malformed_manifest_is_refused(tmp_path: Path, content: bytes) -> None:
    (tmp_path / MANIFEST_NAME).write_bytes(content)
    with pytest.raises(InvalidModel, match="malformed manifest"):
        read_manifest(tmp_path)


def test_names_and_versions() -> None:
    assert check_model_name("resnet-50_v1.b") == "resnet-50_v1.b"
    for bad in ("", ".", "..", ".hidden", "a/b", "a b", "x" * 65, "é"):
        with pytest.raises(InvalidName):
            check_model_name(bad)
    assert check_version("12") == 12 and check_version(3) == 3
    for bad in (0, -1, "x", "1.5", True, "", "+3"):
        with pytest.raises(InvalidName):
            check_version(bad)  # type: ignore[arg-type]
    assert is_version_dir_name("10") and not is_version_dir_name("010")
    assert not is_version_dir_name("0") and not is_version_dir_name(".tmp")


def test_instance_group_gives_the_count_and_its_kind_the_device() -> None:
    config = parse_config({"instance_group": [{"count": 2, "kind": "KIND_GPU"}]}, "c")
    assert config.instances == 2 and config.asked_device() == "gpu"
    assert parse_config({"instance_group": [{"count": 1, "kind": "KIND_CPU"}],
                         "device": "auto"}, "c").asked_device() == "cpu"
    # KIND_AUTO leaves the device to `device`, or to the server.
    assert parse_config({"instance_group": [{"count": 3}]}, "c").asked_device() is None
    assert parse_config({**FULL, "instance_group": [{"count": 3}]}, "c").asked_device() == "cpu"
    assert parse_config({}, "c").instances is None
