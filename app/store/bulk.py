"""Statements on many rows: inserts whose statement text does not depend on the row count, and
deletes that lock their rows in key order."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ColumnElement,
    Insert,
    Integer,
    Text,
    any_,
    bindparam,
    column,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import InstrumentedAttribute
from sqlalchemy.sql.dml import ReturningDelete

from app.models import Step

# The rows of a new run's steps travel as one JSONB parameter, expanded by
# ``jsonb_to_recordset`` (its leases likewise, app/store/placing.py): the statement's text does
# not depend on how many rows there are, so SQLAlchemy compiles it once (a multi-row VALUES is
# compiled again for every statement) and psycopg sends few parameters.
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


def rows_insert(table: type[Step], columns: dict[str, Any], name: str) -> Insert:
    """``INSERT INTO <table> SELECT … FROM jsonb_to_recordset(:<name>)``: the rows are the value
    of the parameter ``name``."""
    source = (
        func.jsonb_to_recordset(bindparam(name, type_=JSONB))
        .table_valued(*(column(c, t) for c, t in columns.items()))
        .render_derived(name=f"{name}_rows", with_types=True)
    )
    names = list(columns)
    picked: list[ColumnElement[Any]] = [source.c[c] for c in names]
    return insert(table).from_select(names, select(*picked))


def delete_in_key_order(
    key: InstrumentedAttribute[str], where: ColumnElement[bool]
) -> ReturningDelete[tuple[str]]:
    """``DELETE … WHERE key = ANY(ARRAY(SELECT key … WHERE where ORDER BY key FOR UPDATE))
    RETURNING key``: every row is locked, in ascending key order, before the first is deleted
    (the array is computed once, ahead of the delete's scan). A plain multi-row DELETE locks its
    rows in the order it happens to scan them, and two of those on the same rows in two orders
    deadlock (docs/queue.md, "Lock order": ascending keys within a kind)."""
    table = key.class_
    keys = select(key).where(where).order_by(key).with_for_update()
    return delete(table).where(key == any_(func.array(keys.scalar_subquery()))).returning(key)
