"""Test helpers shared by several test files and the benchmarks (stdlib-only where a child process runs them)."""
