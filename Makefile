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

.PHONY: demo test test-unit lint bench clean ceph-deps cc-deps quickstart-configs duckdb-peer

# setup.py and the C source: a changed kernel is rebuilt in place (pip install -e builds it into sqe/restrictions/)
# The old build is removed first: the extension is optional, so a build that fails would leave it in place, stale.
$(STAMP): pyproject.toml setup.py sqe/restrictions/_masks.c | cc-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	rm -f sqe/restrictions/_masks*.so
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

# The string masks' C kernels (setup.py) need a C compiler and Python's headers: installed from Debian's packages
# when missing (root or sudo). Without them the install goes on, the masks run as slower Arrow kernels, and
# `make test` fails on tests/unit/sqe/restrictions/test_string_mask_kernels.py::test_the_c_kernels_were_built.
cc-deps:
	@headers=$$($(PYTHON) -c 'import os, sysconfig; print(os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'); \
	if command -v gcc >/dev/null 2>&1 && [ "$$headers" = True ]; then exit 0; fi; \
	sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	echo "installing gcc and Python's headers for the C string masks" >&2; \
	{ $$sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q --no-install-recommends \
		gcc libc6-dev $$([ "$$headers" = True ] || echo python3-dev); } \
	|| echo "no C compiler: the string masks will run as Arrow kernels" >&2

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
	rm -rf $(VENV) $(DEMO_DIR) build *.egg-info sqe/restrictions/_masks*.so
