# Two commands on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
STAMP := $(VENV)/.installed

.PHONY: serve test lint install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/python -m service --model-repository models --host $(HOST) --port $(PORT)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

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
