"""Encryption key-ID pinning and metadata integrity for ``sqe-catalog`` (the Polaris proposals).

- ``state``: trusted per-table state in the catalog database (pin marker, key id or pinned absence, digest and
  digest version), admission audit events and cleanup tasks;
- ``canonical``: exact metadata parsing and writing (format-version 3 included) and the versioned digest;
- ``admission``: the state transitions and admission boundaries (create, commit, register, notifications, load);
- ``purge``: purge through persisted cleanup tasks that verify before deleting.
"""
