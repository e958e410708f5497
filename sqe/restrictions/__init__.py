"""Iceberg REST ``read-restrictions``: parse and validate (fail closed), push down safely, filter and mask.

Typical use by the scanner::

    plan = parse_restrictions(load_table_json.get("read-restrictions"), table.schema(),
                              all_schemas=table.metadata.schemas)
    scan_filter = And(user_filter_on_unmasked_columns, plan.safe_pushdown_filter(table.schema()))
    read_ids = required_columns(plan, projected_ids)
    salt = new_query_salt()                      # once per query, shared by every column and worker
    for batch in batches:                        # read with read_ids
        yield apply(batch, plan, salt=salt, schema=read_schema, output_field_ids=projected_ids)
"""

from sqe.restrictions.actions import ACTIONS, MIN_SALT_BYTES, apply_action, check_applicable
from sqe.restrictions.plan import (
    EMPTY_PLAN,
    ColumnMask,
    RestrictionPlan,
    apply,
    new_query_salt,
    parse_restrictions,
    required_columns,
    strict_json_loads,
)

__all__ = [
    "ACTIONS",
    "EMPTY_PLAN",
    "MIN_SALT_BYTES",
    "ColumnMask",
    "RestrictionPlan",
    "apply",
    "apply_action",
    "check_applicable",
    "new_query_salt",
    "parse_restrictions",
    "required_columns",
    "strict_json_loads",
]
