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
