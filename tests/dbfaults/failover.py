"""A failover under a storm (docs/deploy.md#what-a-switch-costs): the scenario that
``test_failover_storm.py`` runs in three variants and ``bench/switch.py`` measures. The test's own
primary and its synchronous streaming standby (never the machine's shared server),
``database.url`` naming both (the primary first, as an operator lists them), gunicorn with three
workers and ``mediator server reaper`` beside it, and node agents, a submitter and a canceller that
keep going through the switch; ``switch_under_storm`` breaks the primary as a ``Switch`` says,
promotes the standby, checks everything and returns the switch's figures."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from app.dev.embedded import create_database
from app.migrate import upgrade
from tests.dbfaults.load import Agent, Answer, Canceller, Submitter, Tally, one_step, reaper_of
from tests.dbfaults.replica import PrimaryAndStandby
from tests.support.apps import LiveServer, gunicorn_on, ready_workers
from tests.support.concurrency import await_condition, await_value, connect, deadlocks
from tests.support.invariants import check, check_settled

DBNAME = "mediator_storm"
WORKERS = 3
RENEW = 2  # lease.renew_seconds: a lease window of 6 s (factor 3), a reaper pass every 2 s
WINDOW = RENEW * 3
POOL_TIMEOUT = 2.0
STATEMENT_TIMEOUT = 3.0  # a request's client-side deadline: this plus 5 s
CONNECT_TIMEOUT = 2.0  # the Mediator's default, per host tried
HOSTS = 2
LONG_POLL = 30.0
# No request may outlive the pool's wait, a connect time-out per host and the statement
# time-out (docs/deploy.md#11-a-database-with-a-standby); the slack is what a busy 2-core
# machine adds, a safety net.
ANSWER_BOUND = POOL_TIMEOUT + HOSTS * CONNECT_TIMEOUT + STATEMENT_TIMEOUT
SLACK = 3.0
# From then on after the promotion, no 503: every process has found the new primary.
SETTLED_AFTER = POOL_TIMEOUT + HOSTS * CONNECT_TIMEOUT
# A run placed once the switch is over is claimed through the listener's notification, not
# by the 30 s long poll running out (docs/deploy.md#what-a-switch-costs: 0.01 s measured).
CLAIM_BOUND = 2.0
SERVER_ENV = {
    "MEDIATOR_WORKERS": str(WORKERS),
    "MEDIATOR_THREADS": "16",
    "MEDIATOR_DATABASE_POOL_TIMEOUT": str(POOL_TIMEOUT),
    "MEDIATOR_DATABASE_STATEMENT_TIMEOUT_SECONDS": str(STATEMENT_TIMEOUT),
    "MEDIATOR_LEASE_RENEW_SECONDS": str(RENEW),
    "MEDIATOR_CLAIM_LONG_POLL_SECONDS": str(LONG_POLL),
    "MEDIATOR_CLAIM_RECHECK_SECONDS": "3600",
    "MEDIATOR_LOG_LEVEL": "info",  # each worker's "process ready" line
}
FIRST_RUNS = 60
LATER_RUNS = 20


@dataclass(frozen=True)
class Switch:
    how: str  # "kill": kill -9 of every process of the primary; "stop": SIGSTOP of them
    outage: float  # seconds from the fault to the promotion
    rejoin: bool = False  # then the old primary comes back as a replica of the new one


SWITCHES = {
    "kill-after-a-lease-window-then-rejoin": Switch("kill", WINDOW + 2.0, rejoin=True),
    "kill-within-a-lease-window": Switch("kill", WINDOW / 2),
    "stop-after-a-lease-window": Switch("stop", WINDOW + 2.0),
}


def rows(url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


def mediator_sessions(url: str) -> int:
    found = rows(
        url, "select count(*) from pg_stat_activity where application_name like %s", "mediator%"
    )
    return int(found[0][0])


class Storm:
    """The clients: four agents (long polls of 30 s), a submitter and a canceller of every
    fifth run; each keeps what it was told."""

    def __init__(self, live: LiveServer) -> None:
        self.live = live
        self.tally = Tally(timeout=LONG_POLL + ANSWER_BOUND + SLACK)
        self.stop = threading.Event()
        self.agents = [
            Agent(live, f"n{i}", self.tally, self.stop, renew=RENEW, wait=LONG_POLL)
            for i in range(1, 5)
        ]
        self.submitters: list[Submitter] = []
        self.cancellers: list[Canceller] = []

    def start(self) -> None:
        for agent in self.agents:
            agent.start()

    def submit(self, count: int, prefix: str) -> Submitter:
        submitter = Submitter(self.live, self.tally, self.stop, count, every=0.1, prefix=prefix)
        canceller = Canceller(self.live, self.tally, self.stop, submitter, nth=5)
        submitter.start()
        canceller.start()
        self.submitters.append(submitter)
        self.cancellers.append(canceller)
        return submitter

    def accepted(self) -> dict[str, int]:
        return {run: status for s in self.submitters for run, status in s.statuses.items()}

    def rejected(self) -> dict[str, str]:
        return {run: why for s in self.submitters for run, why in s.rejected.items()}

    def cancelled(self) -> dict[str, str]:
        return {run: state for c in self.cancellers for run, state in c.told.items()}

    def finish_submitting(self) -> None:
        for thread in [*self.submitters, *self.cancellers]:
            thread.join(120)
            assert not thread.is_alive(), f"{thread.name} never finished"

    def claimed_at(self, run_id: str) -> float | None:
        for agent in self.agents:
            for run, _, when in list(agent.claimed):
                if run == run_id:
                    return when
        return None


def await_finished(url: str, run_ids: list[str], live: LiveServer) -> None:
    def left() -> list[tuple[Any, ...]]:
        return rows(
            url,
            "select run_id, state from runs where run_id = any(%s)"
            " and state not in ('SUCCEEDED', 'FAILED')",
            run_ids,
        )

    await_condition(
        lambda: not left(),
        "every accepted run finished",
        120,
        interval=0.2,
        explain=lambda: f"{left()}\n{(live.log.read_text()[-3000:] if live.log else '')}",
    )


def probe_claim(storm: Storm, run_id: str) -> float:
    """Seconds from a run's 201 to an agent's claim of its step, all agents idle in a long
    poll."""
    resp = storm.live.post("/v1/runs", one_step(run_id))
    assert resp.status_code == 201, resp.text
    answered = time.monotonic()
    claimed = await_value(lambda: storm.claimed_at(run_id), f"{run_id} claimed", LONG_POLL * 2)
    return claimed - answered


def held_by_the_database(url: str, storm: Storm) -> list[str]:
    """What the clients were told and the new primary does not hold, one line each."""
    out: list[str] = []
    accepted = storm.accepted()
    states = dict(
        rows(url, "select run_id, state from runs where run_id = any(%s)", list(accepted))
    )
    out += [
        f"run {r} was accepted ({s}) and is not there"
        for r, s in accepted.items()
        if r not in states
    ]
    steps = {
        (r, seq): (state, node, code)
        for r, seq, state, node, code in rows(
            url,
            "select run_id, seq, state, node_id, exit_code from steps",
        )
    }
    for agent in storm.agents:
        for run, seq, _ in agent.claimed:
            state, node, _code = steps.get((run, seq), (None, None, None))
            if node != agent.node or state in (None, "PENDING"):
                out.append(f"{agent.node} was handed {run}/{seq}; the database has {state}, {node}")
        for run, seq in agent.acknowledged:
            state, node, code = steps.get((run, seq), (None, None, None))
            if (state, node, code) != ("DONE", agent.node, 0):
                out.append(
                    f"{agent.node}'s result for {run}/{seq} was taken; the database has "
                    f"{state}, {node}, {code}"
                )
    for run, told in storm.cancelled().items():
        if states.get(run) != told:
            out.append(f"the cancel of {run} answered {told}; the database has {states.get(run)}")
    rejected = storm.rejected()
    told_failed = dict(
        rows(url, "select run_id, state from runs where run_id = any(%s)", list(rejected))
    )
    out += [
        f"run {r} was rejected; the database has {told_failed.get(r)}"
        for r in rejected
        if told_failed.get(r) != "FAILED"
    ]
    failed = {r for r, s in states.items() if s == "FAILED"}
    out += [
        f"run {r} FAILED and nobody cancelled it" for r in sorted(failed - set(storm.cancelled()))
    ]
    expired = rows(url, "select run_id from run_events where cause = 'lease expired'")
    out += [f"run {r} ended lease expired" for (r,) in expired]
    return out


def two_servers(pair: PrimaryAndStandby) -> str:
    """The Mediator's database on the primary, the standby started from it, and the URL naming
    both, the primary first."""
    upgrade(create_database(pair.primary.admin_url, DBNAME))
    pair.start_standby()
    return (
        f"postgresql://postgres@127.0.0.1:{pair.primary_port},"
        f"127.0.0.1:{pair.standby_port}/{DBNAME}"
    )


def switch_under_storm(
    pair: PrimaryAndStandby, url: str, tmp_path: Path, switch: Switch
) -> dict[str, Any]:
    """The storm, the switch, every check (an AssertionError names what failed); returns the
    figures of the switch."""
    new_primary = pair.standby_url(DBNAME)
    deadlocks_before = deadlocks(new_primary)
    with gunicorn_on(url, tmp_path, **SERVER_ENV) as live:
        await_condition(
            lambda: len(ready_workers(live)) >= WORKERS, "every worker started", 60, interval=0.1
        )
        with reaper_of(live, tmp_path / "reaper.log"):
            storm = Storm(live)
            storm.start()
            first = storm.submit(FIRST_RUNS, "before")
            await_condition(
                lambda: len(first.accepted) >= 15, "15 runs accepted", 60, interval=0.05
            )

            fault_at = time.monotonic()
            pair.kill_primary() if switch.how == "kill" else pair.stop_primary()
            storm.stop.wait(switch.outage)
            pair.promote()
            promoted_at = time.monotonic()

            storm.finish_submitting()
            await_finished(new_primary, list(storm.accepted()), live)
            claim_seconds = probe_claim(storm, "probe-after-switch")
            if switch.rejoin:
                pair.rejoin_old_primary()
                storm.submit(LATER_RUNS, "after-rejoin")
                storm.finish_submitting()
                await_finished(new_primary, list(storm.accepted()), live)
                assert rows(pair.primary_url(DBNAME), "select pg_is_in_recovery()") == [(True,)]
                assert mediator_sessions(pair.primary_url()) == 0, "a session on the replica"
            storm.stop.set()
            answers = list(storm.tally.answers)
            stop_at = time.monotonic()
            with connect(new_primary) as conn:
                violations = check(conn)
                await_condition(  # one reaper period, two for a busy machine
                    lambda: not check_settled(conn),
                    "nothing stranded",
                    4 * RENEW,
                    interval=0.1,
                    explain=lambda: check_settled(conn),
                )
            lost = held_by_the_database(new_primary, storm)
    assert deadlocks(new_primary) == deadlocks_before

    assert violations == []
    assert lost == []
    assert claim_seconds < CLAIM_BOUND, claim_seconds
    done = [a for a in answers if a.started + a.seconds <= stop_at]
    # A switch longer than a node's liveness leaves no live node until the agents advertise
    # again: a submit meanwhile is 422 "fleet has 0" (docs/deploy.md#what-a-switch-costs).
    fleet_back = promoted_at + SETTLED_AFTER + RENEW
    empty_fleet = [
        a for a in done if a.status == 422 and "fleet has 0" in a.error and a.started < fleet_back
    ]
    others = [a for a in done if a.status not in {200, 201, 202, 204, 409, 503}]
    assert [a for a in others if a not in empty_fleet] == []
    late_503 = [a for a in done if a.status == 503 and a.started >= promoted_at + SETTLED_AFTER]
    assert late_503 == [], late_503[:10]
    slowest = max(done, key=beyond_wait)
    assert beyond_wait(slowest) < ANSWER_BOUND + SLACK, slowest
    during = [a for a in done if fault_at <= a.started + a.seconds and a.started <= promoted_at]
    first_201 = min(
        (
            a.started + a.seconds
            for a in done
            if a.route == "submit" and a.status == 201 and a.started >= promoted_at
        ),
        default=float("nan"),
    )
    return {
        "fault": switch.how,
        "promoted_after_s": switch.outage,
        "requests": len(done),
        "answered_503_during_switch": sum(a.status == 503 for a in during),
        "submits_422_empty_fleet": len(empty_fleet),
        "first_201_after_fault_s": round(first_201 - fault_at, 2),
        "first_201_after_promotion_s": round(first_201 - promoted_at, 2),
        "slowest_s": round(beyond_wait(slowest), 2),
        "slowest_route": slowest.route,
        "probe_claimed_in_s": round(claim_seconds, 3),
        "old_primary_rejoined": switch.rejoin,
    }


def describe(figures: dict[str, Any]) -> str:
    return (
        f"{figures['fault']}, promoted after {figures['promoted_after_s']:g} s: "
        f"{figures['requests']} requests, {figures['answered_503_during_switch']} answered 503 "
        f"during the switch, {figures['submits_422_empty_fleet']} submits 422 before the agents "
        f"advertised again, first 201 {figures['first_201_after_fault_s']} s after the fault, "
        f"slowest {figures['slowest_route']} {figures['slowest_s']} s (beyond its long poll), "
        f"a run placed afterwards claimed in {figures['probe_claimed_in_s']} s"
        + (", the old primary rejoined as a replica" if figures["old_primary_rejoined"] else "")
    )


def beyond_wait(answer: Answer) -> float:
    """How long an answer took beyond what it asked to wait (a claim's long poll)."""
    return answer.seconds - (LONG_POLL if answer.route == "claim" else 0.0)
