"""Throughput of each read-restriction action on 1M values, in values per second, and its cost at scan speed
(measured, not asserted).

Run: .venv/bin/python bench/restrictions_actions.py [--rows N] [--repeat R]

Part 1: each line is the best of R runs of one action over one Arrow array, in wall time and in process CPU
time (every kernel here runs on one thread, so the CPU column is values per second per core, and it moves less
when other jobs share the cores). Same-run baselines put the numbers in context: a plain Arrow string kernel
(utf8_upper) over the same strings, and a copy of the array.

The string masks run in C where the package was built with a compiler; their Arrow kernels (the fallback) are
timed beside them, with the ratio Arrow time / C time.

Part 2 (masked / unmasked): the column is written to an in-memory Parquet file (zstd, as pyiceberg writes);
"unmasked" reads it back, "masked" reads it back and applies the action. The two alternate for R rounds and
the medians are compared (aim: at most 1.15). Single-threaded reads, so the figure is per core. The last column
is the same ratio in process CPU time, which moves less when other jobs share the cores.
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import time
from collections.abc import Callable
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sqe.restrictions import apply_action, new_query_salt, string_masks

SALT = new_query_salt()


def ascii_strings(rows: int, rng: random.Random) -> pa.Array:
    """Email-like ASCII strings of 12-28 characters with 5% nulls."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    values = [
        None
        if rng.random() < 0.05
        else f"{''.join(rng.choices(letters, k=rng.randint(4, 12)))}{rng.randint(0, 99999)}@example.com"
        for _ in range(rows)
    ]
    return pa.array(values, pa.large_string())


def mixed_strings(rows: int, rng: random.Random) -> pa.Array:
    """Strings of 0-24 code points mixing ASCII, accented letters, Arabic-Indic digits and emoji."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789@.-() éü٣😀"
    values = ["".join(rng.choices(alphabet, k=rng.randint(0, 24))) for _ in range(rows)]
    return pa.array(values, pa.large_string())


def columns(rows: int) -> dict[str, pa.Array]:
    rng = random.Random(42)
    micros = [rng.randint(-(10**15), 4 * 10**15) for _ in range(rows)]
    return {
        "string ascii": ascii_strings(rows, rng),
        "string mixed": mixed_strings(rows, rng),
        "string 100 distinct": pa.array([f"r-{rng.randint(0, 99)}" for _ in range(rows)], pa.large_string()),
        "int": pa.array([rng.randint(-(2**31), 2**31 - 1) for _ in range(rows)], pa.int32()),
        "long": pa.array([rng.getrandbits(63) for _ in range(rows)], pa.int64()),
        "binary 16B": pa.array([rng.randbytes(16) for _ in range(rows)], pa.large_binary()),
        "date": pa.array([rng.randint(-30000, 30000) for _ in range(rows)], pa.int32()).view(pa.date32()),
        "timestamptz": pa.array(micros, pa.int64()).view(pa.timestamp("us", tz="UTC")),
        "timestamp_ns": pa.array([m * 1000 for m in micros], pa.int64()).view(pa.timestamp("ns")),
    }


CASES: list[tuple[str, str]] = [
    ("mask-alphanum", "string ascii"),
    ("mask-alphanum", "string mixed"),
    ("show-first-4", "string ascii"),
    ("show-first-4", "string mixed"),
    ("show-last-4", "string ascii"),
    ("show-last-4", "string mixed"),
    ("mask-to-fixed-value", "string ascii"),
    ("mask-to-fixed-value", "long"),
    ("replace-with-null", "string ascii"),
    ("truncate-to-year", "date"),
    ("truncate-to-month", "timestamptz"),
    ("truncate-to-year", "timestamp_ns"),
    ("sha-256-global", "string ascii"),
    ("sha-256-query-local", "string ascii"),
    ("sha-256-query-local", "string 100 distinct"),
    ("sha-256-global", "int"),
    ("sha-256-query-local", "int"),
    ("sha-256-query-local", "long"),
    ("sha-256-query-local", "binary 16B"),
]


def best_seconds(run: Callable[[], object], repeat: int) -> tuple[float, float]:
    """The best wall and the best process CPU seconds of ``repeat`` calls."""
    runs = [timed(run) for _ in range(repeat)]
    return min(wall for wall, _ in runs), min(cpu for _, cpu in runs)


# Timed, but left out of the masked/unmasked ratios (the goals name the other actions and columns).
_TIMED_ONLY = {
    ("mask-to-fixed-value", "string ascii"),
    ("mask-to-fixed-value", "long"),
    ("replace-with-null", "string ascii"),
    ("truncate-to-year", "timestamp_ns"),
    ("sha-256-query-local", "string ascii"),
    ("sha-256-query-local", "string 100 distinct"),
    ("sha-256-global", "int"),
}
RATIO_CASES = [case for case in CASES if case not in _TIMED_ONLY]


def parquet_bytes(array: pa.Array) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"c": array}), sink, compression="zstd")
    return sink.getvalue()


def read_column(data: bytes) -> pa.Array:
    return pq.read_table(pa.BufferReader(data), use_threads=False).column(0).combine_chunks()


def timed(run: Callable[[], object]) -> tuple[float, float]:
    """Wall and process CPU seconds of one call (CPU time is steadier when other jobs share the cores)."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def masked_ratios(data: dict[str, pa.Array], rounds: int) -> None:
    """Median read time with the action over median read time without, rounds interleaved; wall and CPU."""
    print(f"{'action':<22} {'column':<22} {'read ms':>8} {'masked ms':>10} {'masked/unmasked':>16} {'cpu ratio':>10}")
    for action, column in RATIO_CASES:
        encoded = parquet_bytes(data[column])
        plain: list[tuple[float, float]] = []
        masked: list[tuple[float, float]] = []
        for _ in range(rounds):
            plain.append(timed(partial(read_column, encoded)))
            masked.append(timed(lambda: apply_action(action, read_column(encoded), salt=SALT)))  # noqa: B023
        p, m = (statistics.median(t[0] for t in plain), statistics.median(t[0] for t in masked))
        p_cpu, m_cpu = (statistics.median(t[1] for t in plain), statistics.median(t[1] for t in masked))
        print(f"{action:<22} {column:<22} {p * 1000:>8.1f} {m * 1000:>10.1f} {m / p:>16.2f} {m_cpu / p_cpu:>10.2f}")


STRING_MASKS: dict[str, Callable[..., pa.Array]] = {
    "mask-alphanum": string_masks.mask_alphanum,
    "show-first-4": string_masks.show_first_4,
    "show-last-4": string_masks.show_last_4,
}


def string_kernels(data: dict[str, pa.Array], rows: int, repeat: int) -> None:
    """The string masks' C kernels against their Arrow kernels, values per second per core and the ratio."""
    if not string_masks.NATIVE:
        print("string masks: the C kernels were not built (no C compiler at install); only the Arrow kernels run")
        return
    print(f"{'string mask':<22} {'column':<22} {'C values/s/core':>16} {'Arrow values/s/core':>20} {'Arrow/C':>8}")
    for action, mask in STRING_MASKS.items():
        for column in ("string ascii", "string mixed"):
            _, c_cpu = best_seconds(partial(mask, data[column], native=True), repeat)
            _, arrow_cpu = best_seconds(partial(mask, data[column], native=False), repeat)
            c_rate, arrow_rate = rows / max(c_cpu, 1e-9), rows / max(arrow_cpu, 1e-9)
            print(f"{action:<22} {column:<22} {c_rate:>16,.0f} {arrow_rate:>20,.0f} {arrow_cpu / c_cpu:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    data = columns(args.rows)
    print(f"{'action':<22} {'column':<22} {'values/s':>14} {'values/s/core':>14}")
    for action, column in CASES:
        wall, cpu = best_seconds(partial(apply_action, action, data[column], salt=SALT), args.repeat)
        print(f"{action:<22} {column:<22} {args.rows / wall:>14,.0f} {args.rows / max(cpu, 1e-9):>14,.0f}")
    strings = data["string ascii"]
    baselines: list[tuple[str, Callable[[], object]]] = [
        ("baseline utf8_upper", lambda: pc.utf8_upper(strings)),
        ("baseline copy", lambda: pa.concat_arrays([strings, strings.slice(0, 0)])),
    ]
    for name, run in baselines:
        wall, cpu = best_seconds(run, args.repeat)
        print(f"{name:<22} {'string ascii':<22} {args.rows / wall:>14,.0f} {args.rows / max(cpu, 1e-9):>14,.0f}")
    print()
    string_kernels(data, args.rows, args.repeat)
    print()
    masked_ratios(data, max(args.repeat, 5))


if __name__ == "__main__":
    main()
