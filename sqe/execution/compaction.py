"""OPTIMIZE: compaction of an Iceberg table's small files (see the module body)."""
