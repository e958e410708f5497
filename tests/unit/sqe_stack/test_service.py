"""The stack's SQE service processes get the environment their S3 layer needs on every store."""

from __future__ import annotations

from pathlib import Path

from sqe_stack.ceph import CEPH_CLIENT_ENV
from sqe_stack.service import service_env


def test_server_and_workers_get_the_rgw_write_fix() -> None:
    # Regression (soak): INSERT through `sqe serve` on Ceph RGW failed with HTTP 411 on UploadPart, because the
    # server was started with every AWS_* variable scrubbed, the checksum setting included.
    env = service_env()
    assert env["AWS_REQUEST_CHECKSUM_CALCULATION"] == "WHEN_REQUIRED"
    assert CEPH_CLIENT_ENV.items() <= env.items()
    assert not any((k.startswith("AWS_") and "KEY" in k) or k == "AWS_SESSION_TOKEN" for k in env)


def test_the_stacks_workers_share_the_machine_for_partial_aggregation() -> None:
    """The stack's N workers run on one machine: each fragment's database gets a share of N workers' fragments,
    not of one worker's (N workers' defaults would take N halves of the memory), and the worker accepts the flags."""
    from sqe._machine import memory_share
    from sqe_stack.service import WORKER_MAX_FRAGMENTS, worker_limit_flags
    from workers.cli import _parser, options_from_args

    flags = worker_limit_flags(3)
    parsed = options_from_args(_parser().parse_args(["--listen", "127.0.0.1:0", "--insecure-no-token", *flags]))
    limits = parsed.service.aggregate_limits
    assert parsed.service.max_fragments == WORKER_MAX_FRAGMENTS
    assert limits is not None and limits.memory_bytes == memory_share(2 * 3 * WORKER_MAX_FRAGMENTS)
    assert limits.memory_bytes <= memory_share(WORKER_MAX_FRAGMENTS)
    assert limits.spill_bytes == int(flags[flags.index("--aggregate-spill-bytes") + 1]) >= 0


def test_the_stacks_server_engines_and_workers_together_take_one_default_share(tmp_path: Path) -> None:
    """``sqe serve``'s engines and the workers beside it each get half of what one process takes by default (half
    the machine's memory), instead of half the memory each; without workers the server keeps its default."""
    from sqe._machine import memory_share
    from sqe.server.config import load_server_config
    from sqe.server.sessions import engine_limits
    from sqe_stack.catalog import PrincipalCredentials
    from sqe_stack.service import WORKER_MAX_FRAGMENTS, server_config_text, worker_limit_flags
    from workers.cli import _parser, options_from_args

    reader = PrincipalCredentials("sqe-engine", "sqe-engine", "not-a-real-secret")
    (tmp_path / "server-engine.toml").write_text("")
    path = tmp_path / "server.toml"
    path.write_text(server_config_text(reader, 8815, workers=2))
    server = load_server_config(path, env={})
    engines = engine_limits(server)
    flags = worker_limit_flags(2)
    worker = options_from_args(_parser().parse_args(["--listen", "127.0.0.1:0", "--insecure-no-token", *flags]))
    databases = worker.service.aggregate_limits
    assert databases is not None
    server_side = engines.memory_bytes * server.max_concurrent_queries
    workers_side = databases.memory_bytes * 2 * WORKER_MAX_FRAGMENTS
    assert server_side + workers_side <= memory_share(1)
    assert min(server_side, workers_side) >= memory_share(1) // 2 - 2 * server.max_concurrent_queries

    path.write_text(server_config_text(reader, 8815, workers=0))
    alone = load_server_config(path, env={})
    assert alone.engine_memory_bytes is None and engine_limits(alone).memory_bytes == memory_share(16)
