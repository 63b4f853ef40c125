"""Device contexts as values: ``cpu(0)``, ``gpu(1)``, and the current default context."""

from __future__ import annotations

from types import TracebackType

_DEVICE_TYPES = ("cpu", "gpu")


class Context:
    """A device: ``Context('cpu', 0)``; usable as ``with gpu(0):`` to change the default."""

    __slots__ = ("device_type", "device_id")

    def __init__(self, device_type: str | Context, device_id: int = 0) -> None:
        if isinstance(device_type, Context):
            device_type, device_id = device_type.device_type, device_type.device_id
        if device_type not in _DEVICE_TYPES:
            raise ValueError(f"unknown device type {device_type!r}; expected 'cpu' or 'gpu'")
        if not isinstance(device_id, int) or isinstance(device_id, bool) or device_id < 0:
            raise ValueError(f"device id must be a non-negative int, got {device_id!r}")
        self.device_type = device_type
        self.device_id = device_id

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Context) and other.device_type == self.device_type
                and other.device_id == self.device_id)

    def __hash__(self) -> int:
        return hash((self.device_type, self.device_id))

    def __repr__(self) -> str:
        return f"{self.device_type}({self.device_id})"

    __str__ = __repr__

    def __enter__(self) -> Context:
        _STACK.append(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        _STACK.pop()


_STACK: list[Context] = []
_DEFAULT = Context("cpu", 0)


def cpu(device_id: int = 0) -> Context:
    """The CPU context (``device_id`` is kept for MXNet compatibility)."""
    return Context("cpu", device_id)


def gpu(device_id: int = 0) -> Context:
    """GPU number ``device_id``."""
    return Context("gpu", device_id)


def current_context() -> Context:
    """The innermost ``with ctx:`` context, or ``cpu(0)``."""
    return _STACK[-1] if _STACK else _DEFAULT


def resolve_context(ctx: Context | str | None) -> Context:
    """``ctx`` as a `Context`; None means the current default (``with gpu(0):`` or ``cpu(0)``).

    Whether the device can be used is checked where arrays are placed (`engine.nd.placement`).
    """
    if ctx is None:
        return current_context()
    if type(ctx) is Context:
        return ctx
    if isinstance(ctx, str):
        return _parse(ctx)
    return Context(ctx)


def _parse(text: str) -> Context:
    """``"cpu(0)"``/``"gpu(1)"``/``"gpu"`` (MXNet's string form of a context) as a `Context`."""
    name = text.strip().lower()
    if name in _DEVICE_TYPES:
        return Context(name, 0)
    for device_type in _DEVICE_TYPES:
        number = name[len(device_type) + 1:-1]
        if name.startswith(device_type + "(") and name.endswith(")") and number.isdigit():
            return Context(device_type, int(number))
    raise ValueError(f"unknown context {text!r}; expected cpu(N) or gpu(N)")
