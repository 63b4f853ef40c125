# HybridServe container images.
#
#   docker build -t hybridserve:cpu .                          # CPU (NumPy), the default target
#   docker build --target gpu -t hybridserve:gpu .             # CUDA 12 (CuPy)
#
# Both images run `python -m service` as an unprivileged user, read every option from the
# HYBRIDSERVE_* environment variables below and serve the model repository mounted at /models:
# HTTP on port 8000, gRPC on 8001 (publish both: docker run -p 8000:8000 -p 8001:8001 ...).
# Build with BuildKit (Docker >= 23 uses it by default; older engines: DOCKER_BUILDKIT=1 and the
# docker-buildx plugin): the legacy builder runs every stage, so even the CPU image would build
# the GPU stages (downloading CPython, CuPy and the CUDA base). See docs/deploy.md.

ARG PYTHON_IMAGE=python:3.11-slim
ARG CUDA_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04

# ---- wheel: build the project wheel once (pure Python, shared by both variants) -------------
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine/ engine/
COPY service/ service/
RUN python -m pip wheel --no-deps --wheel-dir /wheels .

# ---- builder-cpu: a virtual environment holding the wheel and its pinned dependencies ------
# With the `tracing` extra (OpenTelemetry's SDK and OTLP/HTTP exporter, a few MB): tracing stays
# off until OTEL_TRACES_EXPORTER or HYBRIDSERVE_TRACE asks for it (docs/deploy.md).
FROM ${PYTHON_IMAGE} AS builder-cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
COPY --from=wheel /wheels/ /wheels/
RUN python -m venv /opt/venv \
    && wheel_file="$(echo /wheels/hybridserve-*.whl)" \
    && /opt/venv/bin/python -m pip install "${wheel_file}[tracing]"

# ---- builder-gpu: the same, plus the `gpu-cuda12` extra (CuPy), on a relocatable CPython ----
# The CUDA base image has no Python 3.11, so a standalone CPython build is installed here with
# uv and copied into the runtime stage at the same path; no compiler or apt packages needed.
FROM ${PYTHON_IMAGE} AS builder-gpu
ARG PYTHON_VERSION=3.11
ARG UV_VERSION=0.13.8
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    UV_PYTHON_INSTALL_DIR=/opt/uv-python \
    UV_PYTHON_PREFERENCE=only-managed
COPY --from=wheel /wheels/ /wheels/
RUN python -m pip install "uv==${UV_VERSION}" \
    && uv python install "${PYTHON_VERSION}" \
    && python_bin="$(realpath "$(uv python find "${PYTHON_VERSION}")")" \
    && mv "$(dirname "$(dirname "${python_bin}")")" /opt/python \
    && /opt/python/bin/python3 -m venv /opt/venv \
    && wheel_file="$(echo /wheels/hybridserve-*.whl)" \
    && /opt/venv/bin/python -m pip install "${wheel_file}[gpu-cuda12,tracing]"

# ---- gpu: CUDA 12 runtime (cudart, NVRTC, cuBLAS, ...) + the CuPy environment ---------------
FROM ${CUDA_IMAGE} AS gpu
RUN groupadd --system --gid 10001 hybridserve \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin hybridserve \
    && mkdir -p /models \
    && chown 10001:10001 /models
COPY --from=builder-gpu /opt/python/ /opt/python/
COPY --from=builder-gpu /opt/venv/ /opt/venv/
COPY models/ /opt/hybridserve/default-models/
COPY deploy/healthcheck.py deploy/seed_models.py /opt/hybridserve/
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CUPY_CACHE_DIR=/tmp/cupy-kernel-cache \
    HYBRIDSERVE_CACHE_DIR=/tmp/hybridserve-cache \
    HYBRIDSERVE_MODEL_REPOSITORY=/models \
    HYBRIDSERVE_HOST=0.0.0.0 \
    HYBRIDSERVE_PORT=8000 \
    HYBRIDSERVE_GRPC_PORT=8001 \
    HYBRIDSERVE_DEVICE=gpu
VOLUME ["/models"]
EXPOSE 8000 8001
USER 10001:10001
WORKDIR /opt/hybridserve
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/opt/hybridserve/healthcheck.py"]
ENTRYPOINT ["python", "-m", "service"]

# ---- cpu: the default image (last stage, so a plain `docker build` produces it) -------------
FROM ${PYTHON_IMAGE} AS cpu
RUN groupadd --system --gid 10001 hybridserve \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin hybridserve \
    && mkdir -p /models \
    && chown 10001:10001 /models
COPY --from=builder-cpu /opt/venv/ /opt/venv/
COPY models/ /opt/hybridserve/default-models/
COPY deploy/healthcheck.py deploy/seed_models.py /opt/hybridserve/
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HYBRIDSERVE_CACHE_DIR=/tmp/hybridserve-cache \
    HYBRIDSERVE_MODEL_REPOSITORY=/models \
    HYBRIDSERVE_HOST=0.0.0.0 \
    HYBRIDSERVE_PORT=8000 \
    HYBRIDSERVE_GRPC_PORT=8001 \
    HYBRIDSERVE_DEVICE=cpu
VOLUME ["/models"]
EXPOSE 8000 8001
USER 10001:10001
WORKDIR /opt/hybridserve
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/opt/hybridserve/healthcheck.py"]
ENTRYPOINT ["python", "-m", "service"]
