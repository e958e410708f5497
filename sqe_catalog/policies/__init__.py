"""Tag-based row-filter and column-mask policies (the Gravitino "tag-based read restrictions" design).

- ``rego``: the restricted Rego subset (lexer, parser, save-time type check, limits, stable error codes);
- ``bind``: the request context (end user, flat groups) and schema binding with exact literal typing;
- ``lower``: lowering to one canonical, closed Iceberg expression (null semantics made explicit), signatures;
- ``store``: tags, policies (revisions, audit), policy-on-tag associations in the catalog database;
- ``resolve``: the one resolution pipeline (policies and raw entries alike) with conflicts and explain output;
- ``service``: administration helpers shared by the REST endpoints and ``sqe-catalog admin``.

The feature is off unless ``[server] read_restriction_policies = true``; raw per-principal/group entries go
through ``resolve`` either way (``sqe_catalog.restrictions``).
"""
