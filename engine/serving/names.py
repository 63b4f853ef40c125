"""Validation of model names and version numbers (they become directory names on disk)."""

from __future__ import annotations

import re

from engine.serving.errors import InvalidName

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_model_name(name: str) -> str:
    """Return `name` if it is a valid model name, else raise `InvalidName`."""
    if not isinstance(name, str) or not MODEL_NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidName(f"model name {name!r} is not allowed: expected 1-64 characters from "
                          "[A-Za-z0-9_.-] starting with a letter or digit")
    return name


def check_version(version: int | str) -> int:
    """Return `version` as an int if it is a positive integer (or its decimal string)."""
    if isinstance(version, bool):
        raise InvalidName(f"version {version!r} is not allowed: expected a positive integer")
    if isinstance(version, str):
        if not version.isdecimal() or len(version) > 18:
            raise InvalidName(f"version {version!r} is not allowed: expected a positive integer")
        version = int(version)
    if not isinstance(version, int) or version < 1:
        raise InvalidName(f"version {version!r} is not allowed: expected a positive integer")
    return version


def is_version_dir_name(name: str) -> bool:
    """True if a directory entry names a version: a positive decimal integer, no leading zeros."""
    return (name.isdecimal() and name.isascii() and len(name) <= 18 and int(name) >= 1
            and str(int(name)) == name)
