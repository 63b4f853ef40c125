"""Errors of the serving layer; the service maps each class to exactly one HTTP status."""

from __future__ import annotations

from engine.errors import EngineError, ModelFormatError


class ServingError(EngineError):
    """Base class of the errors raised by the model repository and the batcher."""


class InvalidName(ServingError, ValueError):
    """A model name or version number is not allowed (bad characters, '.', '..', version < 1)."""


class ModelNotFound(ServingError, LookupError):
    """No model of that name exists in the repository."""


class VersionNotFound(ServingError, LookupError):
    """The model exists, but not the requested version."""


class ModelNotReady(ServingError):
    """The model or version exists on disk but is not serving yet (its load is under way, or
    its copy was swapped out as the request reached it): retrying soon helps."""


class ModelNotServing(ModelNotReady):
    """The model or version exists on disk but nothing will serve it until someone acts: it was
    unloaded, its load failed, its version policy does not choose it, or it has no version."""


class Overloaded(ServingError):
    """A batcher's queue is full; `retry_after` (seconds) hints when to try again."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueTimedOut(Overloaded):
    """A request waited in its priority level's queue past the level's timeout, under a
    REJECT queue policy (Triton answers it as unavailable, as a full queue)."""


class TimedOut(ServingError, TimeoutError):
    """A request's deadline passed before its result was ready."""


class Conflict(ServingError):
    """The operation conflicts with the repository's state (e.g. the version already exists)."""


class InvalidModel(ServingError, ModelFormatError):
    """A model version or its config failed validation (parse, ops, params, shapes, test run)."""


class TestRunFailed(InvalidModel):
    """The test inference on synthetic input failed in the engine (a shape, a kernel): the
    model loads, so its load goes on without the run, and its checks say why."""


class MemoryBudgetExceeded(ServingError):
    """Loading a version would take the repository past its configured memory budget."""


class NoRoomToLoad(ModelNotReady):
    """A load on demand found no room under the memory budget: every model holding it is
    pinned or busy. Retrying helps once one of them is idle."""
