"""The bounded candidate read of a placement (``app.store.nodes.first_candidates``), which looks
up the holders of the nodes it returns only as it needs them, against the plain statement it
replaced (every satisfying node's holders looked up, then ordered with free ones first): the
same rows, in the same order, on random fleets with leases, drains, expired adverts and
reservations of runs of several priorities."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from flask import Flask
from sqlalchemy import Integer, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

from app.config import to_libpq_url
from app.store import nodes
from app.store.pipeline import fetch
from tests.support.apps import app_on

# What the read was before: ``busy`` for every satisfying node, then the first ``limit`` ordered
# by (busy, attr_count, node_id).
REFERENCE = text(
    """
    SELECT k.i AS key_no, c.node_id, c.label, c.busy
    FROM jsonb_array_elements(:wanted) WITH ORDINALITY AS k(want, i)
    CROSS JOIN LATERAL (
      SELECT n.node_id, n.label, n.attr_count,
        (n.drain <> ''
         OR EXISTS (SELECT 1 FROM leases WHERE leases.node_id = n.node_id)
         OR (CAST(:reserved_for AS integer) IS NOT NULL AND EXISTS (
               SELECT 1 FROM reservations JOIN runs ON runs.run_id = reservations.run_id
               WHERE reservations.node_id = n.node_id
                 AND runs.priority >= CAST(:reserved_for AS integer)))) AS busy
      FROM nodes AS n
      WHERE n.expires_at > now() AND n.capabilities @> (k.want -> 'contains')
      ORDER BY busy, n.attr_count, n.node_id COLLATE "C"
      LIMIT CAST(k.want ->> 'limit' AS integer)
    ) AS c
    ORDER BY k.i, c.busy, c.attr_count, c.node_id COLLATE "C"
    """
).bindparams(bindparam("wanted", type_=JSONB), bindparam("reserved_for", type_=Integer))

# A dry-run's read before: the first ``limit`` satisfying live nodes, none counted busy.
DRY_REFERENCE = text(
    """
    SELECT k.i AS key_no, c.node_id, c.label, false AS busy
    FROM jsonb_array_elements(:wanted) WITH ORDINALITY AS k(want, i)
    CROSS JOIN LATERAL (
      SELECT n.node_id, n.label, n.attr_count FROM nodes AS n
      WHERE n.expires_at > now() AND n.capabilities @> (k.want -> 'contains')
      ORDER BY n.attr_count, n.node_id COLLATE "C"
      LIMIT CAST(k.want ->> 'limit' AS integer)
    ) AS c
    ORDER BY k.i, c.attr_count, c.node_id COLLATE "C"
    """
).bindparams(bindparam("wanted", type_=JSONB))


def _bounded(
    conn: Any, wanted: list[dict[str, Any]], reserved_for: int | None, *, dry: bool = False
) -> list[tuple[Any, ...]]:
    """The rows of ``app.store.nodes``' bounded read (a branch per wanted entry, 0-based) as the
    references give them: (1-based entry, node, label, busy)."""
    rows = nodes.firsts_rows(conn, wanted, reserved_for, dry=dry)
    return [(key_no + 1, node_id, label, busy) for key_no, node_id, label, busy, *_ in rows]


SOCS = ["a", "b", "c"]
FLEETS = 12  # random fleets, each read with many random wanted lists


@pytest.fixture
def app(clean_db: str, tmp_path: Path) -> Iterator[Flask]:
    with app_on(clean_db, tmp_path / "records") as application:
        yield application


def _fleet(url: str, rng: random.Random) -> None:
    """Nodes (some draining, some expired), runs of priorities -1..2 holding leases and
    reservations on some of them."""
    size = rng.randint(5, 40)
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        for p in range(-1, 3):
            conn.execute(
                "INSERT INTO runs (run_id, state, contract, requires, requires_key, priority)"
                " VALUES (%s, 'RUNNING', '{}', '[]', 'k', %s)",
                (f"run{p}", p),
            )
        for i in range(size):
            attrs = {"soc": rng.choice(SOCS)}
            if rng.random() < 0.5:
                attrs["rev"] = rng.choice(["1", "2"])
            caps = [{"capability": "board", "attrs": attrs}]
            if rng.random() < 0.3:
                caps.append({"capability": "power", "attrs": {}})
            node_id = f"n{rng.randint(0, 99):02d}-{i}"
            conn.execute(
                "INSERT INTO nodes (node_id, label, capabilities, attr_count, drain, expires_at)"
                " VALUES (%s, %s, %s, %s, %s, now() + %s * interval '1 minute')",
                (
                    node_id,
                    f"label {i}",
                    json.dumps(caps),
                    sum(len(c["attrs"]) for c in caps),
                    "soft" if rng.random() < 0.15 else "",
                    -1 if rng.random() < 0.15 else 10,
                ),
            )
            if rng.random() < 0.4:
                conn.execute(
                    "INSERT INTO leases (node_id, run_id, role, capability, nonce, not_after)"
                    " VALUES (%s, %s, 'dut', 'board', 'x', now())",
                    (node_id, f"run{rng.randint(-1, 2)}"),
                )
            if rng.random() < 0.3:
                conn.execute(
                    "INSERT INTO reservations (node_id, run_id) VALUES (%s, %s)",
                    (node_id, f"run{rng.randint(-1, 2)}"),
                )


def _wanted(rng: random.Random) -> list[dict[str, Any]]:
    wanted = []
    for _ in range(rng.randint(1, 3)):
        entry: dict[str, Any] = {"capability": rng.choice(["board", "board", "power"])}
        if entry["capability"] == "board" and rng.random() < 0.8:
            entry["attrs"] = {"soc": rng.choice(SOCS)}
            if rng.random() < 0.3:
                entry["attrs"]["rev"] = rng.choice(["1", "2"])
        wanted.append({"contains": [entry], "limit": rng.randint(1, 5)})
    return wanted


@pytest.mark.parametrize("seed", range(FLEETS))
def test_the_bounded_read_returns_what_the_plain_statement_returned(
    app: Flask, clean_db: str, seed: int
) -> None:
    rng = random.Random(seed)
    _fleet(clean_db, rng)
    db = app.extensions["mediator"].db
    compared = busy_seen = 0
    with db.transaction() as conn:
        for _ in range(40):
            params = {"wanted": _wanted(rng), "reserved_for": rng.choice([None, -1, 0, 1, 2])}
            got = _bounded(conn, params["wanted"], params["reserved_for"])
            assert got == [tuple(r) for r in fetch(conn, REFERENCE, params)], params
            # A dry-run's read: the same first nodes as if none were unavailable.
            dry = _bounded(conn, params["wanted"], None, dry=True)
            nothing_busy = [
                tuple(r) for r in fetch(conn, DRY_REFERENCE, {"wanted": params["wanted"]})
            ]
            assert dry == nothing_busy, params
            compared += 1
            busy_seen += any(row[3] for row in got)
    assert compared == 40
    assert busy_seen or seed % 3, "the fleets must have unavailable nodes among those returned"
