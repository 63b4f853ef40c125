"""A CPU plan's bound step as jobs of parts where it can be (see `engine.cpu.parts`).

A compiled kernel's call makes its own job (`PartedCall.as_job`); a plain NumPy copy or sum of
views becomes a strided job that runs while the pool is armed (`strided_kernel.when_armed`);
anything else stays as it is. What replaces a call keeps it as ``source``.
"""

from __future__ import annotations

from typing import Any

from engine.cpu import parts
from engine.kernels import strided_kernel


def pooled(call: Any, workspace: Any) -> Any:
    """``call`` as jobs of parts where it has them, else ``call`` itself."""
    replacement = parts.as_job(call, workspace)
    if replacement is None:
        replacement = strided_kernel.when_armed(call)
    if replacement is None or replacement is call:
        return call
    replacement.source = call
    return replacement


def source(call: Any) -> Any:
    """The bound call that `pooled` replaced with ``call``, else ``call`` itself."""
    return getattr(call, "source", call)
