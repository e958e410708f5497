#!/usr/bin/env bash
# The ceph quickstart: up, the `make demo` steps, down (see ../run-scenario.sh).
exec bash "$(dirname "$0")/../run-scenario.sh" ceph
