# liftsat: `make demo` and `make test` work on a fresh machine with only a system Python.
# PYTHON=python3.12 make test uses another interpreter (egglog 14 there, 13.2 on 3.11).
PYTHON ?= python3
VENV ?= .venv-$(notdir $(PYTHON))
BIN := $(VENV)/bin

.PHONY: demo test bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/liftsat optimize "Linear(1024, 1000)" "ReLU()" --input 1x1024 --target brainwave

test: $(BIN)/.installed
	$(BIN)/python -m pytest

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/fc.py

clean:
	rm -rf .venv-* *.egg-info .pytest_cache .hypothesis
