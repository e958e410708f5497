# Every target creates or refreshes the local virtualenv by itself: a fresh clone needs only Python.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# DuckDB with its Iceberg extension wheels, apart from the engine's DuckDB: tests/interop (and benches) run it as a
# subprocess through tests/interop/duckdb_peer.py with PYTHONPATH=$(PEER).
PEER       := $(VENV)/duckdb-peer
PEER_REQS  := tests/interop/duckdb_peer_requirements.txt
PEER_STAMP := $(PEER)/.installed
DEMO_DIR ?= .demo-stack
# Test processes of `make test` (pytest-xdist; the suite mostly waits on servers, so more than the cores pays).
TEST_PROCESSES ?= 3

.PHONY: demo test test-unit lint bench clean ceph-deps quickstart-configs duckdb-peer

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,stack]'
	touch $(STAMP)

# Rebuilt from scratch when its requirements change; a rebuilt .venv keeps it (order-only prerequisite).
$(PEER_STAMP): $(PEER_REQS) | $(STAMP)
	rm -rf $(PEER)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --target $(PEER) -r $(PEER_REQS)
	touch $(PEER_STAMP)

duckdb-peer: $(PEER_STAMP)

demo: $(STAMP)
	$(BIN)/python -m sqe_stack.demo --dir $(DEMO_DIR)

# The configs the Docker quickstarts mount, regenerated from the local stack's own code (sqe_stack/quickstart.py).
quickstart-configs: $(STAMP)
	$(BIN)/python -m sqe_stack.quickstart write --root quickstart/compose

# The Ceph RGW enforcement tests need Debian packages: installed here when missing (root or sudo).
ceph-deps:
	bash quickstart/ceph/install-deps.sh

test: $(STAMP) $(PEER_STAMP) ceph-deps
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/catalog_load.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) build *.egg-info
