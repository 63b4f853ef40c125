"""Shared helpers for the deployment-file tests: paths, YAML loading, .dockerignore, nginx."""

from __future__ import annotations

import re
import shutil
import subprocess
from importlib import util as import_util
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
NGINX_CONF = DEPLOY / "nginx" / "nginx.conf"

# The server's health endpoints (KServe V2 / Open Inference Protocol).
LIVE_PATH = "/v2/health/live"
READY_PATH = "/v2/health/ready"
HEALTH_PATHS = frozenset({LIVE_PATH, READY_PATH})

# nginx >= 1.27.3 understands `server ... resolve` inside an upstream block.
NGINX_RESOLVE_VERSION = (1, 27, 3)


def load_script(name: str) -> ModuleType:
    """Import `deploy/<name>.py` (deploy/ is not a package) as a module."""
    spec = import_util.spec_from_file_location(f"deploy_{name}", DEPLOY / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = import_util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document in `path`, parsed safely."""
    with open(path, encoding="utf-8") as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def k8s_objects() -> list[tuple[Path, dict[str, Any]]]:
    """(file, object) for every Kubernetes object under deploy/k8s."""
    files = sorted(K8S.rglob("*.yaml")) + sorted(K8S.rglob("*.yml"))
    return [(path, doc) for path in files for doc in yaml_documents(path)]


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """Translate one .dockerignore pattern (Go filepath.Match plus `**`) to a regex."""
    parts: list[str] = []
    index = 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            parts.append("(?:.*/)?")
            index += 3
        elif pattern.startswith("**", index):
            parts.append(".*")
            index += 2
        elif pattern[index] == "*":
            parts.append("[^/]*")
            index += 1
        elif pattern[index] == "?":
            parts.append("[^/]")
            index += 1
        else:
            parts.append(re.escape(pattern[index]))
            index += 1
    return re.compile("".join(parts))


def dockerignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per rule of a .dockerignore file, in file order."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line[1:] if exception else line
        rules.append((exception, _dockerignore_regex(pattern.strip("/"))))
    return rules


def is_ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker leaves `path` out of the build context (the last matching rule wins).

    As in Docker, a rule matches a path when it matches the path or any of its parent folders.
    """
    pieces = path.strip("/").split("/")
    prefixes = ["/".join(pieces[: count + 1]) for count in range(len(pieces))]
    ignored = False
    for exception, regex in rules:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not exception
    return ignored


def find_nginx() -> str | None:
    """Path of an nginx binary on PATH or in /usr/sbin, or None."""
    found = shutil.which("nginx")
    if found is None and Path("/usr/sbin/nginx").is_file():
        found = "/usr/sbin/nginx"
    return found


def nginx_version(binary: str) -> tuple[int, ...]:
    """The version of an nginx binary, from `nginx -v` (printed on stderr)."""
    result = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=30)
    match = re.search(r"nginx/(\d+(?:\.\d+)*)", result.stderr + result.stdout)
    if match is None:
        raise AssertionError(f"cannot read the version of {binary}: {result.stderr!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def nginx_test_config(config: str, prefix: Path, loopback_ports: list[int] | None,
                      grpc_ports: list[int] | None = None) -> str:
    """A copy of `config` that `nginx -t` can check unprivileged and offline.

    Temporary-file paths move under `prefix`. With `loopback_ports`, the upstreams' DNS-resolved
    servers are replaced by loopback servers (needs no `resolve` support): one per port of
    `loopback_ports` for HTTP (port 8000), of `grpc_ports` (default: the HTTP ports plus 1000)
    for gRPC (8001); and ``http2 on`` (nginx >= 1.25.1) by the older ``listen ... http2``.
    """
    temp_paths = "".join(f"    {kind}_temp_path {prefix / kind};\n"
                         for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    text, count = re.subn(r"^http \{\n", "http {\n" + temp_paths, config, flags=re.MULTILINE)
    if count != 1:
        raise AssertionError("nginx.conf: expected exactly one top-level `http {` block")
    if loopback_ports is None:
        return text
    grpc_ports = grpc_ports if grpc_ports is not None else [port + 1000 for port in loopback_ports]
    for upstream_port, ports in ((8000, loopback_ports), (8001, grpc_ports)):
        servers = "".join(f"server 127.0.0.1:{port} max_fails=1 fail_timeout=10s;\n"
                          for port in ports)
        text, count = re.subn(rf"server \S+:{upstream_port} resolve[^;]*;\n", servers, text)
        if count != 1:
            raise AssertionError(f"nginx.conf: expected one `server HOST:{upstream_port} "
                                 "resolve ...;` line")
    text, count = re.subn(r"listen (\S+);\n(\s*)http2 on;\n", r"listen \1 http2;\n", text)
    if count != 1:
        raise AssertionError("nginx.conf: expected one `listen PORT;` followed by `http2 on;`")
    return text
