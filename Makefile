# Two entry points for a fresh machine: `make serve` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Where torch==2.13.0 comes from. Empty: pip's own choice (this machine's local CPU wheel where it has one, else
# PyPI's CUDA 13 build, several GB). On a CPU machine without the local wheel, opt in to PyTorch's CPU index:
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

$(BIN)/radixserve: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# CPU machines: the pinned torch==2.13.0 CPU build; GPU machines: see README "GPU install".
	$(BIN)/pip install torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -e '.[test]'
	touch $@

.PHONY: install serve test test-slow
install: $(BIN)/radixserve

serve: install
	$(BIN)/radixserve serve serve_config.yaml

# The suite without the scenarios marked slow (load, chaos, autoscaling, the launcher's drain, floods of connections).
test: install
	$(BIN)/python -m pytest -q -m "not slow"

# The slow scenarios; CI (.ci/run) runs both.
test-slow: install
	$(BIN)/python -m pytest -q -m slow
