# Two entry points for a fresh machine: `make serve` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/radixserve: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# CPU machines: the pinned torch==2.13.0 CPU build; GPU machines: see README "GPU install".
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[test]'
	touch $@

.PHONY: install serve test
install: $(BIN)/radixserve

serve: install
	$(BIN)/radixserve serve serve_config.yaml

test: install
	$(BIN)/python -m pytest -q
