"""The enforcement-tier object store: a throw-away Ceph Pacific cluster (1 mon + 1 memstore OSD + radosgw with
STS) under ``DIR/ceph``, loopback only, cephx off, no mgr, no systemd. Data lives in RAM and dies with it.

Ceph RGW really evaluates the inline session policy of ``sts:AssumeRole`` and rejects expired session tokens,
which is what the enforcement tests need (moto does neither). Two client quirks (see
``quickstart/ceph/README.md``): policy JSON must be compact, and pyarrow writes need
``AWS_REQUEST_CHECKSUM_CALCULATION=WHEN_REQUIRED`` in the client's environment.
"""

from __future__ import annotations

import json
import secrets
import shutil
import string
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sqe_stack.provision import (
    LOOPBACK,
    Daemon,
    StackError,
    StoreHandle,
    free_ports,
    http_status,
    run_tool,
    spawn,
    wait_until,
    write_private,
)

CEPH_PACKAGES = "ceph-mon ceph-osd radosgw ceph-common"
CEPH_BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph")
RGW_NAME = "client.rgw.sqe"
CEPH_CLI_ATTEMPTS = 3
CATALOG_USER = "catalog"
ROLE_NAME = "lakehouse"
# RGW ARNs have an empty account field.
ROLE_ARN = f"arn:aws:iam:::role/{ROLE_NAME}"

# Environment a client process needs before pyarrow's S3 layer first starts, for writes against RGW 16:
# the AWS SDK C++ in pyarrow otherwise sends chunked flexible checksums that RGW answers with HTTP 411.
CEPH_CLIENT_ENV: dict[str, str] = {"AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED"}

_ALNUM = string.ascii_letters + string.digits


def missing_binaries() -> list[str]:
    return [name for name in CEPH_BINARIES if shutil.which(name) is None]


def require_binaries() -> None:
    missing = missing_binaries()
    if missing:
        raise StackError(
            f"Ceph store needs {', '.join(missing)} (not on PATH); install the Debian packages "
            f"{CEPH_PACKAGES} (apt-get install {CEPH_PACKAGES})"
        )


def compact_json(doc: object) -> str:
    """RGW 16 rejects policy JSON with spaces after ':'/',' (MalformedPolicyDocument)."""
    return json.dumps(doc, separators=(",", ":"))


def _ceph_conf(root: Path, fsid: str, mon_port: int, rgw_port: int, sts_key: str) -> str:
    return f"""[global]
fsid = {fsid}
mon host = v1:{LOOPBACK}:{mon_port}
public network = 127.0.0.0/8
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
run dir = {root}/run
# no admin sockets: nothing here uses them, and a deep DIR would exceed the 107-byte socket path limit
admin socket =
log file = {root}/log/$name.log
pid file = {root}/run/$name.pid
mon data = {root}/$name
osd data = {root}/$name
osd objectstore = memstore
memstore device bytes = 1073741824
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
# The OSD must not send its own start-up monitor commands: the first one can race the monmap and be refused
# ("wrong fsid"), killing the OSD about 1 start in 10. _create_osd places it in the CRUSH map instead.
osd class update on start = false
osd crush update on start = false
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail crit = 0
# fast paxos commits: RGW creates its pools in well under a second instead of ~9 s
paxos propose interval = 0.05
paxos min wait = 0.01

[{RGW_NAME}]
rgw frontends = beast endpoint={LOOPBACK}:{rgw_port}
rgw sts key = {sts_key}
rgw s3 auth use sts = true
# lets tests ask for 5-second tokens (the default minimum is 900 s)
rgw sts min session duration = 5
"""


def _prepare_dirs(root: Path) -> None:
    if " " in str(root) or "\t" in str(root):
        raise StackError(f"Ceph store: the stack directory must not contain whitespace: {root}")
    shutil.rmtree(root, ignore_errors=True)
    for sub in ("mon.a", "osd.0", "log", "run"):
        (root / sub).mkdir(parents=True)


def _start_mon(root: Path, conf: Path, fsid: str, mon_port: int) -> Daemon:
    monmap = root / "monmap"
    # Explicit v1 address: for a port other than 6789, "--add" would record msgr v2, which "mon host = v1:"
    # clients cannot speak.
    run_tool(
        ["monmaptool", "--create", "--addv", "a", f"[v1:{LOOPBACK}:{mon_port}]", "--fsid", fsid, str(monmap)],
        "monmaptool",
    )
    run_tool(["ceph-mon", "-c", str(conf), "--mkfs", "-i", "a", "--monmap", str(monmap)], "ceph-mon --mkfs")
    return spawn(
        "ceph-mon",
        ["ceph-mon", "-f", "-c", str(conf), "-i", "a"],
        root / "log" / "ceph-mon.out",
        markers=("ceph-mon", str(conf)),
    )


def _ceph(conf: Path, *args: str) -> str:
    """Run the ``ceph`` CLI. Pacific's monitor sometimes refuses a client's first command with EPERM ("wrong
    fsid": it raced the monmap); the commands used here are idempotent, so a failure is retried twice."""
    what = f"ceph {' '.join(args[:2])}"
    argv = ["ceph", "-c", str(conf), "--connect-timeout", "20", *args]
    for attempt in range(CEPH_CLI_ATTEMPTS):
        try:
            return run_tool(argv, what, timeout=30)
        except StackError:
            if attempt + 1 == CEPH_CLI_ATTEMPTS:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


def _create_osd(conf: Path) -> str:
    """Register OSD 0 with the monitor, put it in the CRUSH map and format its memstore; returns its id."""
    osd_uuid = str(uuid.uuid4())
    osd_id = _ceph(conf, "osd", "new", osd_uuid).strip()
    if osd_id != "0":
        raise StackError(f"ceph osd new returned OSD id {osd_id!r}, expected 0")
    mkfs = ["ceph-osd", "-c", str(conf), "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid]
    with ThreadPoolExecutor(max_workers=2) as pool:  # independent steps; each costs a few hundred ms
        jobs = [
            pool.submit(_ceph, conf, "osd", "crush", "add", f"osd.{osd_id}", "1.0", "root=default"),
            pool.submit(run_tool, mkfs, "ceph-osd --mkfs"),
        ]
        for job in jobs:
            job.result()
    return osd_id


def _spawn_osd(root: Path, conf: Path, osd_id: str) -> Daemon:
    argv = ["ceph-osd", "-f", "-c", str(conf), "-i", osd_id]
    return spawn("ceph-osd", argv, root / "log" / "ceph-osd.out", markers=("ceph-osd", str(conf)))


def _spawn_rgw(root: Path, conf: Path) -> Daemon:
    argv = ["radosgw", "-f", "-c", str(conf), "-n", RGW_NAME]
    return spawn("radosgw", argv, root / "log" / "radosgw.out", markers=("radosgw", str(conf)))


def _wait_for_rgw(root: Path, rgw_port: int, started: list[Daemon]) -> None:
    """Wait until RGW answers HTTP (it first creates its pools, which needs the OSD up)."""
    url = f"http://{LOOPBACK}:{rgw_port}/"
    wait_until(lambda: http_status(url) == 200, "radosgw", timeout=60, watch=started, log_hint=f" (see {root / 'log'})")


def _create_user(admin: list[str]) -> tuple[str, str]:
    """S3 user ``catalog`` with a key radosgw-admin generates (so the secret never sits on a command line)."""
    out = run_tool(
        [*admin, "user", "create", f"--uid={CATALOG_USER}", f"--display-name={CATALOG_USER}"],
        "radosgw-admin user create",
    )
    try:
        key = json.loads(out)["keys"][0]
        return str(key["access_key"]), str(key["secret_key"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise StackError("radosgw-admin user create: unexpected output") from None


def _create_user_and_role(conf: Path) -> tuple[str, str]:
    """The S3 user the catalog signs with (it calls sts:AssumeRole), and the role it assumes."""
    # Never with -n: radosgw-admin would then fight the running RGW for its admin socket.
    admin = ["radosgw-admin", "-c", str(conf)]
    access_key, secret_key = _create_user(admin)
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": [f"arn:aws:iam:::user/{CATALOG_USER}"]},
                "Action": ["sts:AssumeRole"],
            }
        ],
    }
    run_tool(
        [
            *admin,
            "role",
            "create",
            f"--role-name={ROLE_NAME}",
            "--path=/",
            f"--assume-role-policy-doc={compact_json(trust)}",
        ],
        "radosgw-admin role create",
    )
    # The role may do anything in S3; each vended credential's session policy narrows it to one table.
    allow_s3 = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": ["s3:*"], "Resource": ["arn:aws:s3:::*"]},
        ],
    }
    run_tool(
        [
            *admin,
            "role-policy",
            "put",
            f"--role-name={ROLE_NAME}",
            "--policy-name=s3all",
            f"--policy-doc={compact_json(allow_s3)}",
        ],
        "radosgw-admin role-policy put",
    )
    return access_key, secret_key


def start_ceph(root: Path, started: list[Daemon]) -> StoreHandle:
    """Start the cluster under ``root`` (wiped first). Every daemon is appended to ``started`` as soon as it
    exists, so the caller can stop them if a later step fails."""
    require_binaries()
    _prepare_dirs(root)
    mon_port, rgw_port = free_ports(2)
    conf = root / "ceph.conf"
    fsid = str(uuid.uuid4())
    sts_key = "".join(secrets.choice(_ALNUM) for _ in range(16))  # RGW requires exactly 16 characters
    write_private(conf, _ceph_conf(root, fsid, mon_port, rgw_port, sts_key))  # holds the STS token key
    started.append(_start_mon(root, conf, fsid, mon_port))
    osd_id = _create_osd(conf)
    started.append(_spawn_osd(root, conf, osd_id))
    started.append(_spawn_rgw(root, conf))
    _wait_for_rgw(root, rgw_port, started)
    endpoint = f"http://{LOOPBACK}:{rgw_port}"
    return StoreHandle.one_endpoint("ceph", endpoint, ROLE_ARN, _create_user_and_role(conf), tuple(started))
