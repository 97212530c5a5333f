"""``queue.reserve_after_seconds`` = 0 turns reservations off: a scan writes the empty set, and a
run that waited any time reserves nothing
(docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits)."""

from __future__ import annotations

from typing import Any

import pytest

from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import single, wide
from tests.support.rows import reservations
from tests.support.submitter import submit


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"queue.reserve_after_seconds": 0}


def test_with_reservations_off_a_scan_writes_the_empty_set(client, ctx, sql):
    advertise(client, "n1", cap())
    advertise(client, "n2", cap())
    submit(client, single("a"), 201)
    submit(client, single("b"), 201)
    submit(client, wide("w"), 202)
    # Left over from a time when reservations were on.
    sql.execute("insert into reservations (node_id, run_id) values ('n1', 'w'), ('n2', 'w')")
    sql.execute("update runs set created_at = created_at - interval '1 hour' where run_id = 'w'")

    submit(client, single("c"), 202)  # its post-queue scan

    assert reservations(sql) == {}
    assert not reap_pass(ctx).woke  # no reservation age to cross
    view = client.get("/v1/runs/w").get_json()
    assert view["reserving"] is False and "reserved" not in view
