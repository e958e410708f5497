#!/usr/bin/env bash
# Installs the Debian packages the Ceph RGW enforcement tier needs, if they are missing (idempotent).
# Used by `make test` and `.ci/run`; needs root (or sudo) and apt.
set -euo pipefail
packages=(ceph-mon ceph-osd radosgw ceph-common uuid-runtime)
missing=0
for bin in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph uuidgen; do
    command -v "$bin" >/dev/null 2>&1 || missing=1
done
[ "$missing" = 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
else
    echo "the Ceph tests need the Debian packages ${packages[*]}; install them as root (apt-get install)" >&2
    exit 1
fi
echo "installing Debian packages for the Ceph enforcement tier: ${packages[*]}" >&2
"${sudo[@]}" apt-get update -q
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${packages[@]}"
