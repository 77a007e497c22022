# `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch first, at the version whose CPU wheel this machine has: the project's own torch
# requirement is a range, and anything that pulled torch before this would fetch a CUDA build.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml setup.py src/servescope/_speedups.c Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev,torch,demo,ray]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/servescope demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m pip install -q prometheus-client opentelemetry-sdk
	$(BIN)/python bench/overhead.py

clean:
	rm -rf $(VENV) servescope-demo build src/servescope/*.so
