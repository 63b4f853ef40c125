"""Service settings: the one place options are read (command line, then HYBRIDSERVE_* variables)."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "HYBRIDSERVE_"
HELP_WIDTH = 78
LogLevel = Literal["critical", "error", "warning", "info", "debug"]
ControlMode = Literal["none", "poll", "explicit"]
DEFAULT_POLL_INTERVAL_S = 15.0  # Triton's --repository-poll-secs


class Settings(BaseSettings):
    """Every option of the server; each field is also the variable ``HYBRIDSERVE_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    model_repository: Path = Field(Path("models"), description="model repository directory")
    create_model_repository: bool = Field(
        False, description="create the model repository directory if it is missing (default: "
        "a missing directory stops the start, so a misspelt path is never served empty)")
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port of the inference API")
    admin_port: int | None = Field(
        None, ge=0, le=65535,
        description="serve the management API on this port only (default: on the main port)")
    grpc_port: int = Field(
        8001, ge=0, le=65535, description="port of the Open Inference Protocol over gRPC (0: no "
        "gRPC server)")
    admin_token: SecretStr | None = Field(
        None, description="bearer token for mutating endpoints (default: generated at first "
        "start and kept in admin_token_file)")
    admin_token_file: Path | None = Field(
        None, description="the admin token's file: read at start, or generated there (mode "
        "0600) when missing; a file root provides for the server's group, mode 0440 (a "
        "Kubernetes Secret mounted as a file), is read as well (default: "
        "MODEL_REPOSITORY/.admin-token, so replicas sharing a repository share it)")
    management: bool = Field(
        True, description="serve the mutating management endpoints (--no-management: refuse "
        "them all, and neither read nor generate a token)")
    max_concurrent_uploads: int = Field(
        2, ge=1, le=64, description="model uploads received at once; more are answered 503")
    model_control_mode: Literal["none", "poll", "explicit"] | None = Field(
        None, description="which models are loaded, and when (Triton's names): none loads every "
        "model at start, poll does too and re-scans the repository every poll_interval seconds, "
        "explicit loads only the --load-model ones at start (default: poll when poll_interval "
        "is set, else none)")
    poll_interval: float | None = Field(
        None, gt=0, description="re-scan the repository every this many seconds (default: "
        f"never; {DEFAULT_POLL_INTERVAL_S:g} under --model-control-mode poll)")
    load_model: tuple[str, ...] = Field(
        (), description="a model to load at start under --model-control-mode explicit "
        "(repeatable; * for every model)")
    load_on_demand: bool = Field(
        False, description="a request for a model in the repository but not loaded loads it, "
        "then runs (concurrent first requests share the load)")
    strict_readiness: bool = Field(
        True, description="report not ready (/v2/health/ready, ServerReady) while a model the "
        "server was asked to serve failed to load (--no-strict-readiness: ready once live)")
    device: Literal["cpu", "gpu", "auto"] = Field("cpu", description="device for models")
    max_request_bytes: int = Field(64 << 20, ge=1024, description="largest request body")
    max_upload_bytes: int = Field(1 << 30, ge=1024, description="largest model upload body")
    max_tensor_elements: int = Field(1 << 24, ge=1, description="largest element count of a tensor")
    body_timeout: float = Field(30.0, gt=0, description="seconds a request body may take to "
                                "arrive; a slower client gets 408")
    memory_budget_bytes: int | None = Field(
        None, ge=1, description="limit on loaded models' memory; a load past it first unloads "
        "the least recently used idle models (never a pinned one)")
    plan_cache_size: int = Field(
        64, ge=1, le=100_000, description="input signatures per model whose compiled plans and "
        "inferred shapes are kept (least recently used evicted first)")
    compute_threads: int = Field(
        1, ge=1, le=256, description="CPU batches computed at once, of all models (default 1: "
        "batches queue for the cores and each runs on all of them, as in process; with more, "
        "each gets its share through blas_threads)")
    image_threads: int = Field(
        2, ge=1, le=256, description="threads decoding and preprocessing images sent to inputs "
        "with a preprocess pipeline (Pillow releases the GIL)")
    blas_threads: int | None = Field(
        None, ge=0, le=256, description="cores one batch uses: threads per BLAS call "
        "(OpenBLAS/MKL/OpenMP), and the engine's own threads follow it (default: the cores "
        "divided by compute_threads, so that batches computed at once never oversubscribe "
        "the cores; 0: the BLAS library's default)")
    switch_interval: float = Field(
        0.0005, gt=0, le=0.1, description="seconds between GIL hand-offs (Python's default "
        "0.005 makes the event loop and the compute threads wait on each other)")
    cache_dir: Path | None = Field(
        None, description="where generated kernel code and numba's compile caches are kept "
        "(default: the user's cache, $XDG_CACHE_HOME/hybridserve or ~/.cache/hybridserve)")
    log_level: LogLevel = Field("info", description="server log level")
    access_log: bool = Field(False, description="log every request")
    trace: bool = Field(
        False, description="export OpenTelemetry traces of inference requests, configured by "
        "the standard OTEL_* variables (needs the tracing extra; setting OTEL_TRACES_EXPORTER "
        "switches it on too)")

    @model_validator(mode="after")
    def _distinct_ports(self) -> Settings:
        if self.admin_port is not None and self.admin_port == self.port and self.port != 0:
            raise ValueError(f"admin_port {self.admin_port} equals port; pick another port or "
                             "leave admin_port unset to serve management on the main port")
        return self

    @model_validator(mode="after")
    def _admin_port_needs_management(self) -> Settings:
        if self.admin_port is not None and not self.management:
            raise ValueError(f"admin_port {self.admin_port} is set, but management is switched "
                             "off; leave admin_port unset or switch management on")
        return self

    @model_validator(mode="after")
    def _control_mode_fits(self) -> Settings:
        mode = self.model_control_mode
        if mode in ("none", "explicit") and self.poll_interval is not None:
            raise ValueError(f"poll_interval {self.poll_interval:g} is set, but "
                             f"model_control_mode {mode} never polls; use poll or leave "
                             "poll_interval unset")
        if self.load_model and self.control_mode != "explicit":
            raise ValueError(f"load_model {list(self.load_model)} selects models under "
                             "model_control_mode explicit only (in the others every model "
                             "loads at start)")
        return self

    @property
    def control_mode(self) -> ControlMode:
        """The model control mode in force: the one given, else poll when a poll interval is
        set, else none (every model loaded at start, no polling)."""
        if self.model_control_mode is not None:
            return self.model_control_mode
        return "poll" if self.poll_interval is not None else "none"

    @property
    def repository_poll_s(self) -> float | None:
        """Seconds between re-scans of the repository (None: never)."""
        if self.control_mode != "poll":
            return None
        return self.poll_interval or DEFAULT_POLL_INTERVAL_S

    @property
    def models_at_start(self) -> frozenset[str] | None:
        """The models loaded at start: None for every model, else those named by load_model
        (explicit mode)."""
        if self.control_mode != "explicit" or "*" in self.load_model:
            return None
        return frozenset(self.load_model)

    @property
    def token(self) -> str | None:
        """The admin token as a string, or None when none is configured (or it is empty)."""
        value = self.admin_token.get_secret_value() if self.admin_token is not None else ""
        return value or None


def _parser(commands: Mapping[str, str]) -> argparse.ArgumentParser:
    description = textwrap.fill(
        "Serve MXNet-format models over HTTP and gRPC. Every option can also be set with an "
        f"environment variable {ENV_PREFIX}<OPTION> (e.g. {ENV_PREFIX}ADMIN_TOKEN); the "
        "command line wins.", HELP_WIDTH)
    epilog = "\n".join(["commands (instead of serving; each has its own --help):",
                        *(f"  hybridserve {name:<14} {what}" for name, what in commands.items())])
    # Raw: the command list keeps one line per command.
    parser = argparse.ArgumentParser(
        prog="hybridserve", description=description, epilog=epilog if commands else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description} (env {ENV_PREFIX}{name.upper()})"
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)
        elif field.annotation == tuple[str, ...]:  # repeatable
            parser.add_argument(flag, dest=name, action="append", default=None,
                                help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, help=help_text)
    return parser


def load_settings(argv: Sequence[str] | None = None,
                  commands: Mapping[str, str] | None = None) -> Settings:
    """Settings from `argv` (default: none) over the environment.

    `commands` (name -> what it does) are listed by ``--help``: the entry point's other
    commands, which it runs instead of the server.

    Raises:
        SystemExit: an option is invalid; the message names the option and the bad value.
    """
    parser = _parser(commands or {})
    given: dict[str, Any] = {key: value for key, value in vars(parser.parse_args(argv)).items()
                             if value is not None}
    try:
        return Settings(**given)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc']) or 'settings'}: "
            f"{problem['msg']} (got {problem.get('input')!r})" for problem in error.errors())
        parser.error(problems)
    raise AssertionError("unreachable")
