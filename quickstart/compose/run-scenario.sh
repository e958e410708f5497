#!/usr/bin/env bash
# Usage: run-scenario.sh SCENARIO (a folder beside this script; each folder's run.sh calls it with its name).
# Brings that quickstart up, runs the `make demo` steps in it, and tears it down (also on failure).
# Untested here: the machines this project is tested on have no Docker engine (see README.md).
set -euo pipefail
scenario="${1:-}"
case "$scenario" in
    rustack | polaris-rustack | ceph) ;;
    *) echo "usage: run-scenario.sh rustack|polaris-rustack|ceph" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/$scenario"
compose=(docker compose -f docker-compose.yml)
trap '"${compose[@]}" --profile demo down --volumes --remove-orphans' EXIT
mkdir -p .state/tls .state/principals
# The coordinator's worker token and self-signed certificates for `sqe serve` and for the workers (plaintext is
# refused off loopback; the workers' one names both compose hosts and is the coordinator's tls_ca).
token="$(openssl rand -hex 24)"
( umask 077; printf '%s\n' "$token" > .state/worker.token; printf 'SQE_COORDINATOR__TOKEN=%s\n' "$token" > .state/coordinator.env )
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=sqe-server" \
    -keyout .state/tls/server.key -out .state/tls/server.crt 2>/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=sqe-worker" \
    -addext "subjectAltName=DNS:sqe-worker-1,DNS:sqe-worker-2" \
    -keyout .state/tls/worker.key -out .state/tls/worker.crt 2>/dev/null
"${compose[@]}" build
"${compose[@]}" up -d --wait
"${compose[@]}" --profile demo run --rm demo
echo "$scenario quickstart finished"
