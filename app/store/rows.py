"""Many rows in one parameter: inserts whose statement text does not depend on the row count."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Insert, Integer, Text, bindparam, column, func, insert, select
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from app.models import Lease, Step

# The rows of a new run's leases and steps travel as one JSONB parameter each, expanded by
# ``jsonb_to_recordset``: the statement's text does not depend on how many rows there are, so
# SQLAlchemy compiles it once (a multi-row VALUES is compiled again for every statement) and
# psycopg sends few parameters.
LEASE_COLUMNS = {
    "node_id": Text,
    "run_id": Text,
    "role": Text,
    "capability": Text,
    "nonce": Text,
    "ttl_seconds": Integer,
}
STEP_COLUMNS = {
    "run_id": Text,
    "seq": Integer,
    "step_id": Text,
    "kind": Text,
    "uses": Text,
    "node_id": Text,
    "needs": ARRAY(Integer),
    "spec": JSONB,
}


def rows_insert(
    table: type[Lease] | type[Step],
    columns: dict[str, Any],
    name: str,
) -> Insert:
    """``INSERT INTO <table> SELECT … FROM jsonb_to_recordset(:<name>)``: the rows are the value
    of the parameter ``name``.
    A ``ttl_seconds`` column becomes ``not_after = now() + ttl``."""
    source = (
        func.jsonb_to_recordset(bindparam(name, type_=JSONB))
        .table_valued(*(column(c, t) for c, t in columns.items()))
        .render_derived(name=f"{name}_rows", with_types=True)
    )
    names = [c for c in columns if c != "ttl_seconds"]
    picked: list[ColumnElement[Any]] = [source.c[c] for c in names]
    if "ttl_seconds" in columns:
        names.append("not_after")
        picked.append(func.now() + func.make_interval(0, 0, 0, 0, 0, 0, source.c.ttl_seconds))
    return insert(table).from_select(names, select(*picked))
