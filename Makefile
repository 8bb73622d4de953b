# The README's two commands: `make demo` and `make test`. Both set themselves up.
VENV ?= .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.blocksync-setup

.PHONY: setup demo test bench lint clean

setup:
	bash scripts/setup_env.sh

demo: setup
	$(VENV)/bin/blocksync run --config conf/local.yaml --overwrite

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	@echo "make bench: no benchmarks are implemented yet (see benchmarks/README.md)." >&2; exit 2

lint: setup
	$(VENV)/bin/ruff check lib tests jobs notebooks
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
