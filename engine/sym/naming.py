"""Automatic node names: ``fullyconnected0``, and prefixes such as Gluon's ``dense0_``.

Like MXNet's ``mx.name.NameManager``/``mx.name.Prefix``: a name given explicitly is kept (with the
current prefix), otherwise the lower-cased op name plus a per-hint counter is used.
"""

from __future__ import annotations

import threading
from types import TracebackType


class NameManager:
    """Hands out ``<hint><counter>`` names; use as ``with NameManager():`` to reset counters."""

    _state = threading.local()

    def __init__(self) -> None:
        self._counter: dict[str, int] = {}
        self._previous: NameManager | None = None

    def get(self, name: str | None, hint: str) -> str:
        """``name`` if given, else ``hint`` followed by how many times the hint was used."""
        if name:
            return name
        count = self._counter.get(hint, 0)
        self._counter[hint] = count + 1
        return f"{hint}{count}"

    def __enter__(self) -> NameManager:
        self._previous = NameManager.current()
        NameManager._state.value = self
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        NameManager._state.value = self._previous

    @staticmethod
    def current() -> NameManager:
        """The active name manager of this thread."""
        manager = getattr(NameManager._state, "value", None)
        if manager is None:
            manager = NameManager._state.value = NameManager()
        return manager


class Prefix(NameManager):
    """Prepends ``prefix`` to every name, given or automatic (Gluon's ``dense0_fwd``)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._prefix = prefix

    def get(self, name: str | None, hint: str) -> str:
        """``prefix + (name or hint<counter>)``."""
        return self._prefix + super().get(name, hint)


def node_name(name: str | None, hint: str) -> str:
    """A node name from the current manager."""
    return NameManager.current().get(name, hint)
