"""HybridServe's engine: operators, graphs, the hybrid frontend, the compiler and runtime.

Example:
    >>> import engine
    >>> model = engine.load_model("my_mlp-symbol.json", "my_mlp-0000.params")
    >>> outputs = model.infer({"data": x})
"""

from __future__ import annotations

from typing import Any

from engine.context import Context, cpu, gpu

__all__ = ["Context", "Model", "TensorSpec", "cpu", "gpu", "load_model"]
_RUNTIME = ("Model", "TensorSpec", "load_model")


def __getattr__(name: str) -> Any:
    # Loaded lazily so that `import engine.ops` does not pull in the runtime and its readers.
    if name in _RUNTIME:
        import engine.runtime as runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
