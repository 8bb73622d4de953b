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
	bash scripts/test_services.sh
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	$(PY) -m benchmarks $(BENCH_ARGS)

lint: setup
	$(VENV)/bin/ruff check lib tests jobs notebooks benchmarks
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
