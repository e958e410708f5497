"""``sqe serve``: SQE as a multi-user service behind Arrow Flight SQL.

Layering: this package sits at the top of the engine, beside the CLI. It imports ``sqe.session``,
``sqe.config`` and ``sqe.catalog``; nothing in the engine imports it. Modules: ``config`` (the ``[server]``
model), ``identity`` (authentication at the catalog, RFC 8693 delegation), ``sessions`` (client sessions,
limits, watchdog), ``flight`` (the Flight SQL service), ``metadata`` (catalog browsing results), ``errors``
(Flight status mapping), ``serve`` (the process), ``client`` (the ``sqe --server`` side).
"""
