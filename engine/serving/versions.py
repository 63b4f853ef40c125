"""`VersionRecord`: everything the repository knows about one model version, in one place.

Transitions (the method the repository calls, from which phases, to which):

    begin_load    UNAVAILABLE, FAILED, UNLOADING -> LOADING      (READY stays READY: the old
                                                                   copy serves meanwhile)
    publish       any -> READY                  (a copy it replaces starts draining)
    fail          LOADING -> FAILED              (READY stays READY: a failed replacement)
    abandon_load  LOADING -> UNAVAILABLE, or UNLOADING while a copy drains (a cancelled load)
    retire        READY -> UNLOADING             (the serving copy starts draining)
    drained       UNLOADING -> UNAVAILABLE       (once the last draining copy has finished)

Copies taken out of service stay in `draining`, and in the memory accounting, until their last
request has finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Set
from dataclasses import dataclass, field
from enum import StrEnum

from engine.serving.config import VersionPolicy
from engine.serving.loaded import LoadedVersion, VersionState, VersionStatus

Identity = tuple[str | None, str | None]  # (manifest digest, config digest)


class Phase(StrEnum):
    """Where one version stands; FAILED shows as UNAVAILABLE (with its reason) in the index."""

    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    FAILED = "FAILED"


_SHOWN_AS = {Phase.UNAVAILABLE: VersionState.UNAVAILABLE, Phase.LOADING: VersionState.LOADING,
             Phase.READY: VersionState.READY, Phase.UNLOADING: VersionState.UNLOADING,
             Phase.FAILED: VersionState.UNAVAILABLE}


@dataclass(eq=False)
class VersionRecord:
    """One model version: its phase, why it is not serving, the copy that serves and those
    draining, the files whose load failed, and what an operator asked of it.

    Invariant: `serving` is set exactly when `phase` is READY.
    """

    name: str
    version: int
    phase: Phase = Phase.UNAVAILABLE
    reason: str = "not loaded"
    serving: LoadedVersion | None = None
    failed: Identity | None = None  # the files (and config) whose last load failed
    draining: dict[LoadedVersion, asyncio.Task[None]] = field(default_factory=dict)
    pinned: bool = False  # loaded beside the version policy's choice (``load(name, version)``)
    excluded: bool = False  # kept unloaded whatever the policy says (``unload(name, version)``)

    @property
    def identity(self) -> Identity | None:
        """The identity of the files serving now (None when none serve)."""
        return None if self.serving is None else self.serving.identity

    @property
    def idle(self) -> bool:
        """Nothing serving, loading or draining: the record only remembers a reason."""
        return self.serving is None and not self.draining and self.phase is not Phase.LOADING

    def status(self) -> VersionStatus:
        """The index row of this version (a reason only when it is unavailable)."""
        state = _SHOWN_AS[self.phase]
        reason = self.reason if state is VersionState.UNAVAILABLE else ""
        return VersionStatus(self.name, self.version, state, reason)

    def begin_load(self) -> None:
        """A load of this version started; a serving copy keeps serving until it succeeds."""
        if self.phase is not Phase.READY:
            self.phase = Phase.LOADING

    def fail(self, identity: Identity, reason: str) -> None:
        """The load of `identity` failed: polling will not retry these same files."""
        self.failed, self.reason = identity, reason
        if self.phase is not Phase.READY:
            self.phase = Phase.FAILED

    def abandon_load(self) -> None:
        """A load stopped without an outcome (cancelled): back to where it was."""
        if self.phase is Phase.LOADING:
            self.phase = Phase.UNLOADING if self.draining else Phase.UNAVAILABLE

    def publish(self, new: LoadedVersion) -> LoadedVersion | None:
        """Make `new` the serving copy; returns the copy it replaces, which must be drained."""
        assert (new.name, new.version) == (self.name, self.version)
        old, self.serving = self.serving, new
        self.phase, self.reason, self.failed = Phase.READY, "", None
        return old

    def retire(self) -> LoadedVersion:
        """Take the serving copy out of service; returns it, to be drained."""
        assert self.serving is not None, f"{self.name} {self.version} is not serving"
        old, self.serving = self.serving, None
        self.phase, self.reason = Phase.UNLOADING, "unloaded"
        return old

    def drained(self, old: LoadedVersion) -> None:
        """`old` finished its last request; the version is unloaded once no copy drains."""
        self.draining.pop(old, None)
        if self.phase is Phase.UNLOADING and not self.draining:
            self.phase = Phase.UNAVAILABLE


def wanted_versions(policy: VersionPolicy, complete: Iterable[int], *, pinned: Set[int],
                    excluded: Set[int]) -> set[int]:
    """The versions to serve: the policy's choice among the complete versions on disk, plus
    the pinned ones, less the excluded ones (an incomplete version is never wanted).

    Example:
        >>> wanted_versions(VersionPolicy(), {1, 2, 3}, pinned={1}, excluded=set())
        {1, 3}
    """
    available = set(complete)
    return ((set(policy.select(available)) | set(pinned)) & available) - set(excluded)
