"""REST catalog access for the engine: per-user clients, load-table with the raw JSON kept, ETag cache."""
