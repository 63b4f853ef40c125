"""Class labels of a model's outputs, for Triton's classification extension.

An output's ``labels`` in config.json names a text file, one label a line (line N is class
N's label). It is looked up in the version's folder (where an upload's ``labels`` part is
kept), then beside config.json in the model's folder. The file must hold exactly one label per
class: the elements of one row of the output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from engine.serving.config import CONFIG_NAME, TensorConfig
from engine.serving.errors import InvalidModel

MAX_LABELS_BYTES = 16 << 20


def read_labels(version_dir: Path, outputs: Sequence[TensorConfig],
                where: str) -> dict[str, tuple[str, ...]]:
    """The labels of every output whose (completed) config names a labels file, by output name.

    Raises:
        InvalidModel: a file is missing, unreadable, too large, or its line count is not the
            output's class count.
    """
    labels = {}
    for index, tensor in enumerate(outputs):
        if tensor.labels is None:
            continue
        path = _find(version_dir, tensor.labels)
        if path is None:
            raise InvalidModel(f"{where}: outputs.{index}.labels: no file {tensor.labels!r} for "
                               f"output {tensor.name!r} in the version's folder or beside "
                               f"{CONFIG_NAME}; upload it as part 'labels' (file name "
                               f"{tensor.labels!r})")
        lines = _read_lines(path, where)
        _check_count(index, tensor, len(lines), where)
        labels[tensor.name] = lines
    return labels


def _find(version_dir: Path, name: str) -> Path | None:
    """The labels file `name` of a version, or None. Only a numbered version folder has a
    model folder above it (an upload's staging folder sits in the repository's root)."""
    folders = [version_dir]
    if version_dir.name.isdigit() and (version_dir.parent / CONFIG_NAME).is_file():
        folders.append(version_dir.parent)
    return next((folder / name for folder in folders if (folder / name).is_file()), None)


def _read_lines(path: Path, where: str) -> tuple[str, ...]:
    try:
        if path.stat().st_size > MAX_LABELS_BYTES:
            raise InvalidModel(f"{where}: {path.name} is over {MAX_LABELS_BYTES} bytes; a labels "
                               "file holds one short label a line")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidModel(f"{where}: {path.name} is not UTF-8 text: {error}") from None
    except OSError as error:
        raise InvalidModel(f"{where}: cannot read {path.name}: {error}") from None
    # One label a line; a final newline ends the last label rather than starting an empty one.
    return tuple(line.rstrip("\r") for line in text.removesuffix("\n").split("\n")) if text else ()


def _check_count(index: int, tensor: TensorConfig, count: int, where: str) -> None:
    assert tensor.shape is not None  # the config is completed before labels are read
    dims = tensor.shape[1:]
    post = tensor.postprocess
    if post is not None and post.detection is not None:
        return  # class ids are the values, not a dimension: no shape bounds the count
    if post is not None and post.segmentation is not None:
        dims = tensor.shape[1:2]  # [N, C, H, W]: one label per class C
    if any(dim < 0 for dim in dims):
        raise InvalidModel(f"{where}: outputs.{index}.labels: output {tensor.name!r} has shape "
                           f"{list(tensor.shape)}, so its class count is not fixed; give its "
                           "shape in config.json to label it")
    classes = math.prod(dims)
    if count != classes:
        raise InvalidModel(f"{where}: outputs.{index}.labels: {tensor.labels!r} has {count} "
                           f"labels; output {tensor.name!r} (shape {list(tensor.shape)}) has "
                           f"{classes} classes")
