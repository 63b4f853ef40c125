"""What a starting server checks and claims before it serves: the model repository directory and
its listening ports. Each failure is a `StartError` whose message names the option (and its
environment variable) to change, and the server exits with it before loading any model."""

from __future__ import annotations

import socket
from pathlib import Path

from service.settings import ENV_PREFIX, Settings

# uvicorn's default: connections the kernel queues while the event loop is busy.
LISTEN_BACKLOG = 2048


class StartError(Exception):
    """The server cannot start as configured; the message says which option to change."""


def option_names(field: str) -> str:
    """``--grpc-port / HYBRIDSERVE_GRPC_PORT`` for the settings field ``grpc_port``."""
    return f"--{field.replace('_', '-')} / {ENV_PREFIX}{field.upper()}"


def address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_repository(settings: Settings) -> Path:
    """The model repository directory, created only when the settings ask for it.

    A misspelt path must not start a server with an empty repository (and write a new admin
    token into it), so a missing directory stops the start unless
    ``--create-model-repository`` is given.

    Raises:
        StartError: the path is missing (and not to be created), or is not a directory.
    """
    path = settings.model_repository
    if path.is_dir():
        return path
    where = f"model repository {str(path)!r} (absolute: {path.absolute()})"
    if path.exists():
        raise StartError(f"{where} is not a directory; set {option_names('model_repository')} "
                         "to a directory")
    if not settings.create_model_repository:
        raise StartError(f"{where} does not exist; check {option_names('model_repository')}, "
                         f"or pass {option_names('create_model_repository')}=true to create "
                         "an empty one")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise StartError(f"{where} does not exist and cannot be created: {error}") from None
    return path


def bind_http(host: str, port: int, field: str) -> socket.socket:
    """A TCP socket bound to ``host:port`` for an HTTP server, not yet listening.

    Binding at start finds a taken port before any model is loaded; uvicorn listens on the
    socket once the app has started, so until then connections are refused, as before a bind.

    Raises:
        StartError: the address cannot be bound (the port is taken, or the host is not this
            machine's); the message names `field`'s option and variable.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # A restarted server must get its port back while old connections sit in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise StartError(f"cannot listen for HTTP on {address(host, port)}: "
                         f"{error.strerror or error}; choose another port with "
                         f"{option_names(field)}") from None
    return sock


def bound_address(sock: socket.socket) -> str:
    """``host:port`` the socket is bound to (the real port where port 0 was asked for)."""
    host, port = sock.getsockname()[:2]
    return address(host, port)
