# Two commands on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
GRPC_PORT ?= 8001
STAMP := $(VENV)/.installed

.PHONY: serve test container-test k8s-check lint install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/python -m service --model-repository models --host $(HOST) --port $(PORT) \
		--grpc-port $(GRPC_PORT)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

# Not part of `test`: builds the image and runs the Compose deployment on a real Docker engine
# (BuildKit and Compose >= 2.20), a few minutes. Results: docs/deploy.md.
container-test: $(STAMP)
	@command -v docker >/dev/null 2>&1 || { echo "make container-test needs Docker Engine with \
	BuildKit (docker-buildx) and the Compose v2 plugin >= 2.20 (docker-compose-plugin); see \
	docs/deploy.md" >&2; exit 1; }
	HYBRIDSERVE_CONTAINER_TEST=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m container \
		tests/container

# checkov's Kubernetes policies over deploy/k8s, from an environment of its own (checkov pins
# many packages, so it is not part of the dev extra); accepted exceptions: docs/deploy.md.
CHECKOV_VENV := build/checkov-venv
CHECKOV_VERSION := 3.3.30
k8s-check: $(STAMP)
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet 'checkov==$(CHECKOV_VERSION)'
	HYBRIDSERVE_CHECKOV=$(CHECKOV_VENV)/bin/checkov $(BIN)/python -m pytest -q \
		-p no:cacheprovider tests/deploy/test_checkov.py

clean:
	rm -rf $(VENV)

# The GPU path against the real CuPy, NVRTC and cuDNN frontend wheels, on a machine without a
# GPU (about 1 GB in its own environment, so not part of `make test`; CI can run it as a
# separate, cached job).
CUPY_VENV := build/cupy-venv
.PHONY: cupy-check
cupy-check:
	$(PYTHON) -m venv $(CUPY_VENV)
	$(CUPY_VENV)/bin/python -m pip install --quiet -e '.[cupy-check]'
	HYBRIDSERVE_REQUIRE_CUPY_WHEEL=1 $(CUPY_VENV)/bin/python -m pytest -q -p no:cacheprovider \
		tests/engine/gpu/test_cupy_wheel.py

# The gRPC messages and service stubs from service/grpc/inference.proto (generated files are
# checked in; grpcio-tools is pinned in the dev extra, so the output is reproducible).
.PHONY: grpc-codegen
grpc-codegen: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. \
		service/grpc/inference.proto
