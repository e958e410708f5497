#!/usr/bin/env bash
# Inside the Ceph demo container's namespaces: turn on RGW STS with the settings the local Ceph stack uses
# (sqe_stack/ceph.py: rgw sts key, rgw s3 auth use sts, rgw sts min session duration = 5), then create the
# catalog's S3 user (demo-only key from catalog.toml) and the role it assumes. Untested here (no Docker engine).
set -euo pipefail
until ceph -s >/dev/null 2>&1 && radosgw-admin user list >/dev/null 2>&1; do sleep 2; done
sts_key="$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"   # 16 characters, as RGW requires
ceph config set client.rgw rgw_sts_key "$sts_key"
ceph config set client.rgw rgw_s3_auth_use_sts true
ceph config set client.rgw rgw_sts_min_session_duration 5
radosgw-admin user create --uid=catalog --display-name=catalog \
    --access-key=sqe-demo-catalog --secret=sqe-demo-catalog-secret >/dev/null || true
radosgw-admin caps add --uid=catalog --caps="roles=*" >/dev/null
trust='{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":["arn:aws:iam:::user/catalog"]},"Action":["sts:AssumeRole"]}]}'
radosgw-admin role create --role-name=lakehouse --assume-role-policy-doc="$trust" >/dev/null || true
radosgw-admin role-policy put --role-name=lakehouse --policy-name=s3all \
    --policy-doc='{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:*"],"Resource":"*"}]}'
# RGW reads the STS options at start: restart it inside the demo container.
pkill -f radosgw || true
