"""What one process shares, under REST and gRPC alike: settings, the repository, the data plane's
services (inference, metrics, upload slots, drain), readiness and the admin access."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

from engine.serving.repository import ModelRepository
from engine.serving.validate import default_loader
from service.admin_token import AdminAccess
from service.collector import CompilerFrozenFirst, freeze_lasting
from service.dataplane.drain import DrainState
from service.dataplane.inference import InferenceService
from service.dataplane.metrics import Metrics
from service.dataplane.repository import UploadSlots
from service.settings import Settings
from service.tracing import Tracing, from_environment

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What the apps and the gRPC server of one process share: settings, repository, the data
    plane's services, readiness."""

    settings: Settings
    repository: ModelRepository
    metrics: Metrics
    inference: InferenceService
    admin: AdminAccess
    uploads: UploadSlots
    started: bool = False  # the repository is loaded, and shutdown has not begun
    drain: DrainState = field(default_factory=DrainState)
    tracing: Tracing = field(default_factory=Tracing)

    @property
    def ready(self) -> bool:
        """Started and not stopping; with strict readiness, also no model the server was
        asked to serve failing to load (`ModelRepository.failed_models`)."""
        if not self.started:
            return False
        return not (self.settings.strict_readiness and self.repository.failed_models())

    @ready.setter
    def ready(self, value: bool) -> None:
        self.started = value

    @classmethod
    def create(cls, settings: Settings, repository: ModelRepository | None = None, *,
               admin: AdminAccess | None = None, tracing: Tracing | None = None) -> Runtime:
        """A runtime over `repository`, or over a new one configured by `settings`.

        `admin` defaults to what `settings` alone give (`AdminAccess.from_settings`), and
        `tracing` to what ``--trace`` and the ``OTEL_*`` variables ask for
        (`service.tracing.from_environment`, which raises `TracingUnavailable`).
        """
        tracing = tracing or from_environment(settings.trace)
        loader = CompilerFrozenFirst(functools.partial(default_loader,
                                                       plan_cache_size=settings.plan_cache_size))
        repository = repository or ModelRepository(
            settings.model_repository, loader=loader, device=settings.device,
            memory_budget_bytes=settings.memory_budget_bytes,
            poll_interval_s=settings.repository_poll_s, compute_threads=settings.compute_threads,
            models_at_start=settings.models_at_start, load_on_demand=settings.load_on_demand)
        if tracing.batch_observer is not None:
            repository.batch_observer = tracing.batch_observer
        metrics = Metrics(repository)
        drain = DrainState()
        metrics.in_flight.set_function(lambda: drain.in_flight)
        return cls(settings, repository, metrics,
                   InferenceService(repository, metrics, settings.max_tensor_elements,
                                    settings.image_threads, tracing),
                   admin or AdminAccess.from_settings(settings),
                   UploadSlots(settings.max_concurrent_uploads), drain=drain, tracing=tracing)

    async def start(self) -> None:
        """Scan and load the repository, then report ready."""
        await self.repository.start()
        # What exists now (modules, models) lives as long as the process: keep it out of the
        # collector's full passes, which otherwise scan it all and stall requests (tail latency).
        freeze_lasting()
        self.ready = True
        log.info("model repository %s ready: %d version(s), model control mode %s",
                 self.settings.model_repository, len(self.repository.index()),
                 self.settings.control_mode)
        failed = self.repository.failed_models()
        if failed:
            log.error("models that failed to load: %s; %s", ", ".join(failed),
                      "the server reports not ready until they serve (strict readiness)"
                      if self.settings.strict_readiness else "the server reports ready")

    async def close(self) -> None:
        """Report not ready, then drain and unload every model."""
        self.ready = False
        await self.repository.close()
        self.inference.close()
        self.tracing.shutdown()
