"""The invariant checker's rules about reservations
(docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits,
docs/reliability.md#the-invariant-checker) find what they are for: a reservation of a run that is
not QUEUED, a reserved node leased afterwards to a run of equal or lower priority, and a QUEUED run
that fits nodes not reserved against it."""

from __future__ import annotations

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import single, wide
from tests.support.invariants import check, check_quiet
from tests.support.submitter import submit


def test_a_reservation_of_a_run_that_is_not_queued_is_a_violation(client, sql):
    advertise(client, "n1", cap())
    submit(client, single("a"), 201)
    assert check(sql) == []
    sql.execute("insert into reservations (node_id, run_id) values ('n9', 'a')")

    assert check(sql) == ["run a is RUNNING but holds a reservation on node n9"]


def test_a_reserved_node_leased_later_to_an_equal_priority_run_is_a_violation(client, sql):
    advertise(client, "n1", cap())
    advertise(client, "n2", cap())
    submit(client, single("a"), 201)
    submit(client, wide("w"), 202)
    # w reserved n1 before a's lease was taken (a promotion: the order is exact).
    sql.execute("update runs set promoted_at = created_at + interval '1 minute' where run_id = 'a'")
    sql.execute("update leases set created_at = created_at + interval '1 minute'")
    sql.execute("insert into reservations (node_id, run_id, since) values ('n1', 'w', now())")

    found = check(sql)
    assert len(found) == 1 and found[0].startswith("node n1 reserved by w (priority 0)")

    # A higher-priority run may pass the reservation.
    sql.execute("update runs set priority = 1 where run_id = 'a'")
    assert check(sql) == []


def test_the_quiet_check_honours_reservations_and_their_priority(client, sql):
    advertise(client, "n1", cap())
    advertise(client, "n2", cap())
    submit(client, single("a"), 201)
    submit(client, wide("w"), 202)
    submit(client, single("c"), 201)
    assert client.post("/v1/runs/c/cancel").status_code == 200
    sql.execute("insert into reservations (node_id, run_id) values ('n2', 'w'), ('n1', 'w')")
    submit(client, single("e"), 202)  # n2 is free but reserved against it

    assert check_quiet(sql) == []
    sql.execute("delete from reservations")
    assert check_quiet(sql) == ["run e is QUEUED though free nodes fit it: ['n2']"]
    sql.execute("insert into reservations (node_id, run_id) values ('n2', 'w'), ('n1', 'w')")
    sql.execute("update runs set priority = 1 where run_id = 'e'")
    assert check_quiet(sql) == ["run e is QUEUED though free nodes fit it: ['n2']"]
