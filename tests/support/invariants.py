"""The Mediator's invariants, read from its tables with plain SQL the way an operator would.

Every check returns the list of violations it found (one line each, naming the run, node or
step), never raises on the first, and reads one snapshot (a REPEATABLE READ, READ ONLY
transaction), so it may sample a database that is busy:

- :func:`check`: what holds at every moment — no node leased twice or assigned to two live runs,
  every placed run holding a lease on each node of its unreleased roles (and no lease it does not
  account for), a QUEUED run holding nothing, steps agreeing with their run's state, no run
  half-created (a run row without all its steps); no reservation of a run that is not QUEUED,
  and no node reserved by a run leased afterwards to another run of equal or lower priority; the
  kept number of QUEUED runs of each priority (``queue_counts``) equal to a count of them.
- :func:`check_after_reaper_pass`: what one reaper pass leaves on a quiet system — no lease of a
  finished run, no run left VERIFYING, every finished run sealed (rejected submits excepted).
- :func:`check_quiet`: once nothing moves, no QUEUED run whose requirements fit live, free,
  non-draining nodes that are not reserved against it; "fits" is the service's own matcher
  (:func:`app.match.match`) over the adverts, leases and reservations read here.
- :func:`check_settled`: the three together, for the end of a test.

The connection is a psycopg connection in autocommit mode (the ``sql`` fixture, or
:func:`tests.support.concurrency.connect`): each check opens its own transaction on it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from app.contract.types import role_from_wire
from app.match import (
    Assignment,
    adverts_from_rows,
    candidate_order,
    match_within_cap,
    width_exceeded,
)

ALIVE_PLACED = ("RUNNING", "VERIFYING")  # runs that hold their nodes
FINISHED = ("SUCCEEDED", "FAILED")
OPEN_STEPS = ("PENDING", "CLAIMED", "ASKED")

Rows = list[dict[str, Any]]


@contextmanager
def snapshot(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Cursor[dict[str, Any]]]:
    """A cursor inside one REPEATABLE READ, READ ONLY transaction: every query sees the same
    committed state, whatever commits meanwhile."""
    assert conn.autocommit, "the checker opens its own transaction: pass an autocommit connection"
    with conn.transaction():
        cur = conn.cursor(row_factory=dict_row)
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield cur


def _rejected(run: dict[str, Any]) -> bool:
    """A rejected submit: born FAILED with a 422 ``reject``, no steps and no Record
    (docs/queue.md#on-submit-placed-queued-or-rejected)."""
    reject = run.get("reject")
    return (
        run["state"] == "FAILED" and isinstance(reject, dict) and str(reject.get("Code")) == "422"
    )


def live_roles(run: dict[str, Any]) -> dict[str, list[str]]:
    """Role -> nodes of the run's ``assigned``, minus released roles (acquired roles included)."""
    out: dict[str, list[str]] = {}
    for entry in run.get("assigned") or []:
        if isinstance(entry, dict) and not entry.get("released"):
            out[str(entry.get("as"))] = [str(n) for n in entry.get("nodes") or []]
    return out


def assigned_nodes(run: dict[str, Any]) -> set[str]:
    """Every node the run was ever assigned, released roles included."""
    return {
        str(n)
        for entry in run.get("assigned") or []
        if isinstance(entry, dict)
        for n in entry.get("nodes") or []
    }


# ---------------------------------------------------------------- at every moment


def check(conn: psycopg.Connection[Any]) -> list[str]:
    """The invariants that hold at every moment, busy or quiet, in one snapshot."""
    with snapshot(conn) as cur:
        runs: Rows = cur.execute(
            "select run_id, state, assigned, reject, ended_at,"
            " jsonb_array_length(coalesce(contract->'steps', '[]'::jsonb)) as declared"
            " from runs"
        ).fetchall()
        steps: Rows = cur.execute(
            "select run_id, seq, step_id, state, node_id, claimed_instance from steps"
        ).fetchall()
        leases: Rows = cur.execute("select node_id, run_id from leases").fetchall()
        twice: Rows = cur.execute(
            "select node_id, count(*) as n from leases group by node_id having count(*) > 1"
        ).fetchall()
        reserved: Rows = cur.execute(
            "select r.node_id, r.run_id, h.state from reservations r join runs h using (run_id)"
            " order by r.node_id"
        ).fetchall()
        passed: Rows = cur.execute(PASSED_RESERVATIONS, {"slack": SUBMIT_SLACK_SECONDS}).fetchall()
        miscounted: Rows = cur.execute(MISCOUNTED_PRIORITIES).fetchall()
    out: list[str] = [f"node {r['node_id']} is leased {r['n']} times" for r in twice]
    out += [
        f"priority {r['priority']}: {r['queued']} runs QUEUED, {r['counted']} in queue_counts"
        for r in miscounted
    ]
    out += _placement_violations(runs, leases)
    out += _step_violations(runs, steps)
    out += [
        f"run {r['run_id']} is {r['state']} but holds a reservation on node {r['node_id']}"
        for r in reserved
        if r["state"] != "QUEUED"
    ]
    out += [
        f"node {r['node_id']} reserved by {r['holder']} (priority {r['holder_priority']}) since"
        f" {r['since']} was leased at {r['leased_at']} to {r['run_id']} (priority"
        f" {r['priority']})"
        for r in passed
    ]
    return out


# The kept number of QUEUED runs of each priority (a trigger on runs) against a count of them.
MISCOUNTED_PRIORITIES = """
SELECT coalesce(q.priority, c.priority) AS priority, coalesce(q.n, 0) AS queued,
       coalesce(c.n, 0) AS counted
FROM (SELECT priority, count(*) AS n FROM runs WHERE state = 'QUEUED' GROUP BY priority) q
FULL JOIN (SELECT priority, sum(queued) AS n FROM queue_counts GROUP BY priority) c
  ON c.priority = q.priority
WHERE coalesce(q.n, 0) <> coalesce(c.n, 0)
"""

# A run placed at submit (or a node acquired mid-run) decides on the reservations it read a
# moment before its own transaction began; a promotion decides under the scan gate, after the
# scan wrote its reservations, so for it the order of the two times is exact.
SUBMIT_SLACK_SECONDS = 2.0

PASSED_RESERVATIONS = """
select l.node_id, l.run_id, l.created_at as leased_at, lr.priority,
       r.run_id as holder, h.priority as holder_priority, r.since
from leases l
join reservations r on r.node_id = l.node_id
join runs lr on lr.run_id = l.run_id
join runs h on h.run_id = r.run_id
where l.run_id <> r.run_id
  and lr.priority <= h.priority
  and l.created_at > r.since + case
        when lr.promoted_at = l.created_at and lr.promoted_at <> lr.created_at
        then interval '0'
        else make_interval(secs => %(slack)s)
      end
order by l.node_id
"""


def _placement_violations(runs: Rows, leases: Rows) -> list[str]:
    out: list[str] = []
    by_id = {r["run_id"]: r for r in runs}
    held: dict[str, set[str]] = defaultdict(set)  # run -> nodes it holds a lease on
    for lease in leases:
        held[lease["run_id"]].add(lease["node_id"])
    holders: dict[str, list[str]] = defaultdict(list)  # node -> live runs with a live role on it
    for run in runs:
        if run["state"] not in ALIVE_PLACED:
            continue
        roles = live_roles(run)
        if run.get("assigned") is None:
            out.append(f"run {run['run_id']} is {run['state']} without an assignment")
        nodes = {n for ns in roles.values() for n in ns}
        for node in sorted(nodes):
            holders[node].append(run["run_id"])
            if node not in held[run["run_id"]]:
                role = next(r for r, ns in roles.items() if node in ns)
                out.append(
                    f"run {run['run_id']} is {run['state']} without a lease on node {node}"
                    f" of its role {role} (not released)"
                )
        for node in sorted(held[run["run_id"]] - nodes):
            out.append(
                f"run {run['run_id']} holds a lease on node {node}, which fills none of its"
                " unreleased roles"
            )
    for node, runs_on in sorted(holders.items()):
        if len(runs_on) > 1:
            out.append(f"node {node} is assigned to live roles of {len(runs_on)} runs: {runs_on}")
    for lease in sorted(leases, key=lambda r: r["node_id"]):
        owner = by_id.get(lease["run_id"])
        if owner is None:
            out.append(f"lease on node {lease['node_id']} names no run: {lease['run_id']}")
        elif owner["state"] == "QUEUED":
            out.append(f"run {owner['run_id']} is QUEUED but holds a lease on {lease['node_id']}")
    return out


def _step_violations(runs: Rows, steps: Rows) -> list[str]:
    out: list[str] = []
    of_run: dict[str, Rows] = defaultdict(list)
    for st in steps:
        of_run[st["run_id"]].append(st)
    known = {r["run_id"] for r in runs}
    for run_id in sorted(set(of_run) - known):
        out.append(f"steps of {run_id} belong to no run")
    for run in runs:
        rid, state = run["run_id"], run["state"]
        mine = sorted(of_run.get(rid, []), key=lambda st: st["seq"])
        if _rejected(run):
            if mine:
                out.append(f"run {rid} was rejected at submit but has {len(mine)} steps")
        elif len(mine) != run["declared"] or [st["seq"] for st in mine] != list(
            range(1, len(mine) + 1)
        ):
            out.append(
                f"run {rid} is half-created: {len(mine)} steps stored,"
                f" {run['declared']} in its contract"
            )
        if (state in FINISHED) != (run["ended_at"] is not None):
            out.append(f"run {rid} is {state} with ended_at {run['ended_at']}")
        if state == "QUEUED" and run.get("assigned") is not None:
            out.append(f"run {rid} is QUEUED with an assignment")
        assigned = assigned_nodes(run)
        for st in mine:
            name = f"{rid}#{st['seq']:02d}"
            if state in FINISHED and st["state"] in OPEN_STEPS:
                out.append(f"run {rid} is {state} but step {name} is {st['state']}")
            elif state == "VERIFYING" and st["state"] in OPEN_STEPS:
                out.append(f"run {rid} is VERIFYING but step {name} is {st['state']}")
            elif state == "QUEUED" and (
                st["state"] != "PENDING"
                or st["node_id"] is not None
                or st["claimed_instance"] is not None
            ):
                out.append(
                    f"run {rid} is QUEUED but step {name} is {st['state']} on node {st['node_id']}"
                )
            if st["state"] == "CLAIMED" and st["node_id"] is None:
                out.append(f"step {name} is CLAIMED by no node")
            if st["node_id"] is not None and state != "QUEUED" and st["node_id"] not in assigned:
                out.append(f"step {name} is bound to {st['node_id']}, not assigned to {rid}")
    return out


# ---------------------------------------------------------------- after a reaper pass


def check_after_reaper_pass(conn: psycopg.Connection[Any]) -> list[str]:
    """What one reaper pass leaves behind once nothing else moves
    (docs/reliability.md#the-invariant-checker): no lease of a finished run, no run left VERIFYING,
    every finished run sealed except rejected submits."""
    with snapshot(conn) as cur:
        leased: Rows = cur.execute(
            "select l.node_id, r.run_id, r.state from leases l join runs r using (run_id)"
            " where r.state in ('SUCCEEDED', 'FAILED') order by l.node_id"
        ).fetchall()
        verifying: Rows = cur.execute(
            "select run_id from runs where state = 'VERIFYING' order by run_id"
        ).fetchall()
        unsealed: Rows = cur.execute(
            "select run_id, state, reject from runs"
            " where state in ('SUCCEEDED', 'FAILED') and sealed_at is null order by run_id"
        ).fetchall()
    out = [
        f"run {r['run_id']} is {r['state']} but still holds a lease on {r['node_id']}"
        for r in leased
    ]
    out += [f"run {r['run_id']} is still VERIFYING after a reaper pass" for r in verifying]
    out += [
        f"run {r['run_id']} is {r['state']} but its Record is not sealed"
        for r in unsealed
        if not _rejected(r)
    ]
    return out


# ---------------------------------------------------------------- once the system is quiet


def check_quiet(
    conn: psycopg.Connection[Any],
    *,
    max_per_run: int = 0,
    max_nodes: Mapping[str, int] | None = None,
) -> list[str]:
    """No QUEUED run whose requirements fit live, free, non-draining nodes not reserved against
    it (a reserved node is free only to its holder and to runs of higher priority:
    docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits) and whose team is below
    its ``max_nodes`` by the run's width (``max_nodes``: stored team name -> its quota;
    docs/teams.md, "Quotas"). Runs are taken in queue order (priority descending, then arrival) and
    each one found fitting takes its nodes and gives up its reservations, as a scan would, so every
    line names a run that a scan would have promoted."""
    quotas = dict(max_nodes or {})
    with snapshot(conn) as cur:
        nodes: Rows = cur.execute(
            "select node_id, capabilities, label, drain from nodes where expires_at > now()"
        ).fetchall()
        leased = {r["node_id"] for r in cur.execute("select node_id from leases").fetchall()}
        # An operator's hold or a quarantine keeps a node out (docs/operators.md).
        out = {
            r["node_id"]
            for r in cur.execute(
                "select node_id from node_health"
                " where hold_mode is not null or quarantined_at is not null"
            ).fetchall()
        }
        queued: Rows = cur.execute(
            "select run_id, requires, priority, team from runs where state = 'QUEUED'"
            " order by priority desc, created_at, run_id"
        ).fetchall()
        holding = {
            r["team"]: r["n"]
            for r in cur.execute("select team, count(*) as n from leases group by team")
        }
        held = {
            r["node_id"]: (r["run_id"], r["priority"])
            for r in cur.execute(
                "select r.node_id, r.run_id, h.priority from reservations r"
                " join runs h using (run_id)"
            ).fetchall()
        }
    adverts = candidate_order(
        adverts_from_rows((r["node_id"], r["capabilities"], r["label"]) for r in nodes)
    )
    unavailable = leased | out | {r["node_id"] for r in nodes if r["drain"]}
    out: list[str] = []
    for run in queued:
        against = {
            n for n, (holder, p) in held.items() if holder != run["run_id"] and run["priority"] <= p
        }
        roles = [role_from_wire(r) for r in run["requires"]]
        outcome = match_within_cap(roles, adverts, unavailable | against, max_per_run, ordered=True)
        if isinstance(outcome, Assignment) and not width_exceeded(outcome, max_per_run):
            team, width = run["team"], len(set(outcome.nodes()))
            if team in quotas and holding.get(team, 0) + width > quotas[team]:
                continue  # its team is at its quota
            holding[team] = holding.get(team, 0) + width
            out.append(f"run {run['run_id']} is QUEUED though free nodes fit it: {outcome.nodes()}")
            unavailable |= set(outcome.nodes())
            held = {n: h for n, h in held.items() if h[0] != run["run_id"]}
    return out


def marks(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """(the last wake mark taken, 0 for none; the highest mark a scan has covered)."""
    mark, covered = conn.execute(
        "select (select case when is_called then last_value else 0 end from wake_mark),"
        " (select last_value from wake_covered)"
    ).fetchone()
    return mark, covered


def check_marks(conn: psycopg.Connection[Any]) -> list[str]:
    """Nothing owed (docs/queue.md, "Which commit frees, and its mark"): every wake mark taken is
    covered by a scan that started after it, and no wake debt is set. Holds once the system is
    quiet and the reaper has passed twice (a pass pays the marks its predecessor read)."""
    out = []
    mark, covered = marks(conn)
    if mark > covered:
        out.append(f"wake mark {mark} not covered (wake_covered {covered})")
    for (reason,) in conn.execute("select reason from wake_debt"):
        out.append(f"wake debt set: {reason}")
    return out


def check_settled(
    conn: psycopg.Connection[Any],
    *,
    max_per_run: int = 0,
    max_nodes: Mapping[str, int] | None = None,
) -> list[str]:
    """Every check, for a quiet system after two reaper passes."""
    return (
        check(conn)
        + check_after_reaper_pass(conn)
        + check_quiet(conn, max_per_run=max_per_run, max_nodes=max_nodes)
        + check_marks(conn)
    )
