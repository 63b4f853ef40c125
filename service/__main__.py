"""``python -m service`` / ``hybridserve``: run the server, REST on uvicorn (uvloop, httptools) and
gRPC beside it, on one event loop over one `service.runtime.Runtime`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import uvicorn

from engine.cpu import usable_cores  # standard library only: numpy loads after BLAS is set
from service.settings import Settings, load_settings
from service.startup import (
    LISTEN_BACKLOG,
    StartError,
    address,
    bind_http,
    bound_address,
    check_repository,
    option_names,
)

if TYPE_CHECKING:
    import grpc

    from service.runtime import Runtime

# The entry point's other commands (its first argument): name -> what it does, for --help.
COMMANDS = {"export-onnx": "convert an MXNet export (symbol + params) to ONNX"}
BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
DRAIN_GRACE_S = 10.0


class _Server(uvicorn.Server):
    """A uvicorn server on a socket bound at start (`startup.bind_http`), whose signals are
    handled by `serve` (two servers share one loop)."""

    def __init__(self, config: uvicorn.Config, sock: socket.socket, field: str) -> None:
        super().__init__(config)
        self.sock = sock
        self.field = field  # the settings field of its port, named in errors

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Leave signal handling to `serve`."""
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start the app, then listen on our socket: until the app has started (its models
        loaded) connections are refused, so a load balancer tries another replica at once.

        Raises:
            StartError: another process listened on the port after `bind_http` bound it.
        """
        start_app = self.lifespan.startup

        async def start_app_then_listen() -> None:
            await start_app()
            if not self.lifespan.should_exit:
                # uvloop would take a socket it cannot listen on without a word.
                self.sock.listen(LISTEN_BACKLOG)

        self.lifespan.startup = start_app_then_listen  # type: ignore[method-assign]
        try:
            await super().startup(sockets)
        except OSError as error:
            await self.lifespan.shutdown()  # as uvicorn does when its own bind fails
            where = bound_address(self.sock)
            self.sock.close()
            raise StartError(f"cannot listen for HTTP on {where}: {error.strerror or error}; "
                             f"choose another port with {option_names(self.field)}") from None


def _config(app: object, settings: Settings) -> uvicorn.Config:
    return uvicorn.Config(app, loop="uvloop", http="httptools", lifespan="on",
                          log_level=settings.log_level, access_log=settings.access_log,
                          timeout_graceful_shutdown=10, backlog=LISTEN_BACKLOG)


async def serve(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM: one port, or inference and management on two ports."""
    from service import admin_token
    from service.rest.app import create_app  # imports numpy: after `limit_blas_threads`
    from service.runtime import Runtime

    # Every port is claimed before anything is loaded, so a taken one stops the start at once.
    split = settings.admin_port is not None
    sockets = {"port": bind_http(settings.host, settings.port, "port")}
    if settings.admin_port is not None:
        sockets["admin_port"] = bind_http(settings.host, settings.admin_port, "admin_port")
    admin = admin_token.resolve(settings)
    print(admin_token.start_message(admin, settings), file=sys.stderr, flush=True)
    runtime = Runtime.create(settings, admin=admin)
    grpc_server = await _start_grpc(runtime)
    servers = [_Server(_config(create_app(runtime, management=not split), settings),
                       sockets["port"], "port")]
    if split:
        servers.append(_Server(_config(create_app(runtime, inference=False, owns_runtime=False),
                                       settings), sockets["admin_port"], "admin_port"))
    print(listeners_message(settings, sockets), file=sys.stderr, flush=True)
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for server in servers:
            server.should_exit = True

    async def drain_then_stop() -> None:
        # Not ready at once (load balancers move away), new inference answers 503, requests in
        # flight finish, and only then do the servers stop listening.
        runtime.ready = False
        await runtime.drain.drain(DRAIN_GRACE_S)
        stop()

    def on_signal() -> None:
        loop.create_task(drain_then_stop())

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    tasks = [loop.create_task(server.serve(sockets=[server.sock])) for server in servers]
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    stop()  # one server stopping (or failing to start) stops the other
    await asyncio.gather(*tasks, return_exceptions=True)
    if grpc_server is not None:
        await grpc_server.stop(DRAIN_GRACE_S)
    for task in done:
        task.result()


def listeners_message(settings: Settings, sockets: dict[str, socket.socket]) -> str:
    """Every address the server answers on, and the option that sets each, one per line."""
    http = {"port": "inference and management" if len(sockets) == 1 else "inference",
            "admin_port": "management"}
    lines = [f"HTTP: http://{bound_address(sock)} ({http[field]} API; {option_names(field)})"
             for field, sock in sockets.items()]
    grpc = option_names("grpc_port")
    if settings.grpc_port == 0:
        lines.append(f"gRPC: off ({grpc} is 0)")
    else:
        lines.append(f"gRPC: {address(settings.host, settings.grpc_port)} (Open Inference "
                     f"Protocol; {grpc})")
    return "\n".join(lines)


async def _start_grpc(runtime: Runtime) -> grpc.aio.Server | None:
    """The gRPC server on the same loop and runtime as the HTTP apps, unless switched off.

    Raises:
        StartError: the gRPC port cannot be listened on.
    """
    if runtime.settings.grpc_port == 0:
        return None
    from service.grpc.server import GrpcPortError, start_grpc

    try:
        return await start_grpc(runtime)
    except GrpcPortError as error:
        raise StartError(f"{error}; the gRPC port is set by {option_names('grpc_port')}") \
            from None


def blas_threads_for(settings: Settings) -> int:
    """BLAS threads per call: `blas_threads`, else this process's cores shared out among the
    compute threads (every core for one batch at a time)."""
    if settings.blas_threads is not None:
        return settings.blas_threads
    return max(1, usable_cores.count() // settings.compute_threads)


def limit_blas_threads(threads: int) -> None:
    """Set the BLAS thread variables (read when numpy loads; an explicit variable wins)."""
    if threads == 0:
        return
    if "numpy" in sys.modules:
        logging.getLogger(__name__).warning("numpy is already imported; blas_threads ignored")
    for variable in BLAS_VARIABLES:
        os.environ.setdefault(variable, str(threads))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m service`` and the ``hybridserve`` script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["export-onnx"]:  # a tool, not the server: no settings, no uvloop
        from engine.onnx.__main__ import main as export_onnx

        return export_onnx(args[1:])
    settings = load_settings(args, COMMANDS)
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One infer uses as many cores as BLAS's thread count (its rows split, or its steps spread
    # over the spin pool, docs/threads.md): the compute threads' share of the cores.
    limit_blas_threads(blas_threads_for(settings))
    logging.getLogger(__name__).info("CPU: %s; BLAS threads %s", usable_cores.describe(),
                                     blas_threads_for(settings) or "as the library chooses")
    from engine.cpu import blas_threads, cache  # imports numpy: after `limit_blas_threads`

    # OpenBLAS started its threads as numpy loaded; start them anew flushing denormals, as
    # every thread that runs kernels does (before any request: no BLAS call is running).
    blas_threads.restart_flushed()
    if settings.cache_dir is not None:
        cache.set_cache_dir(settings.cache_dir)
    sys.setswitchinterval(settings.switch_interval)
    import uvloop

    from service.admin_token import TokenFileError
    from service.tracing import TracingUnavailable

    try:
        check_repository(settings)
        uvloop.run(serve(settings))
    except (StartError, TokenFileError, TracingUnavailable) as error:
        print(f"hybridserve: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
