"""Block name scopes: MXNet's prefixes (``hybridsequential0_``, ``dense0_``, ``dense0_fwd``).

A top-level block takes ``<alias><n>_`` from the global symbol name manager; a block created
inside ``with parent.name_scope():`` takes ``<parent prefix><alias><k>_`` with a counter kept by
the parent. Entering a scope also makes symbol nodes created inside it carry the block's prefix.
"""

from __future__ import annotations

import threading
from types import TracebackType

from engine.sym.naming import NameManager, Prefix

_STATE = threading.local()


def current_scope() -> BlockScope | None:
    """The innermost entered block scope of this thread, or None."""
    return getattr(_STATE, "value", None)


def make_prefix(prefix: str | None, hint: str) -> str:
    """The prefix of a new block: given, counted under the current scope, or counted globally."""
    scope = current_scope()
    if scope is None:
        return prefix if prefix is not None else NameManager.current().get(None, hint) + "_"
    if prefix is None:
        count = scope.counter.get(hint, 0)
        scope.counter[hint] = count + 1
        prefix = f"{hint}{count}_"
    return scope.prefix + prefix


class BlockScope:
    """``with block.name_scope():`` — children and symbol nodes get the block's prefix.

    It knows the block only by its prefix, so that blocks depend on scopes and not back.
    A ``transparent`` scope (a block created with ``prefix=""``) changes nothing when entered.
    """

    def __init__(self, prefix: str, *, transparent: bool = False) -> None:
        self.prefix = prefix
        self.transparent = transparent
        self.counter: dict[str, int] = {}
        self._previous: list[BlockScope | None] = []
        self._names: list[Prefix] = []

    def __enter__(self) -> BlockScope:
        if self.transparent:
            return self
        self._previous.append(current_scope())
        _STATE.value = self
        names = Prefix(self.prefix)
        names.__enter__()
        self._names.append(names)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self.transparent:
            return
        self._names.pop().__exit__(kind, error, trace)
        _STATE.value = self._previous.pop()
