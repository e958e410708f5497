#!/usr/bin/env bash
# The rustack quickstart: up, the `make demo` steps, down (see ../run-scenario.sh).
exec bash "$(dirname "$0")/../run-scenario.sh" rustack
