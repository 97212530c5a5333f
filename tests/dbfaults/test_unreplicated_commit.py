"""A COMMIT whose wait for the synchronous standby is cancelled (an administrator's
``pg_cancel_backend``, a failover manager's) returns with a WARNING: it committed on this server
only, and a failover may lose it. The request is answered 503 ``database unavailable, try again``
with ``Retry-After: 1``, as one whose outcome is unknown, never 201
(docs/deploy.md#11-a-database-with-a-standby); repeated, it is answered as the database holds it.
On a server of the tests' own, whose ``synchronous_standby_names`` names a standby that never
connects, so every commit waits until it is cancelled."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from app.config import to_libpq_url
from tests.dbfaults.server import RestartablePostgres
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import app_on, client_of
from tests.support.concurrency import await_condition
from tests.support.contracts import one_step


def _standby_named(url: str, name: str | None) -> None:
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        if name is None:
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        else:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
        conn.execute("SELECT pg_reload_conf()")


def _waiting_for_the_standby(url: str) -> list[int]:
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event = 'SyncRep'"
        ).fetchall()
    return [r[0] for r in rows]


def _cancel(url: str, pid: int) -> None:
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        conn.execute("SELECT pg_cancel_backend(%s)", (pid,))


def test_a_commit_whose_wait_for_the_standby_is_cancelled_is_answered_503(
    own_server: RestartablePostgres, tmp_path: Path
) -> None:
    url = own_server.new_database()
    with app_on(url, tmp_path / "records", **{"database.pool_size": 1}) as app:
        client = client_of(app)
        ctx = app.extensions["mediator"]
        advertise(client, "n1", cap("board"))
        _standby_named(url, "standby_that_never_comes")
        try:
            resp = _cancelling_each_wait(url, lambda: client.post("/v1/runs", json=one_step("a")))
            assert resp.status_code == 503, resp.get_json()
            assert resp.get_json() == {
                "error": {"code": 503, "reason": "database unavailable, try again"}
            }
            assert resp.headers["Retry-After"] == "1"
            assert ctx.owed.is_set()  # its outcome is unknown: a mark and a scan are owed
            # Repeated, the submit finds the run on this server, but its 200 waits for the
            # standby to hold it too: cancelled, that wait is a 503 again.
            again = _cancelling_each_wait(url, lambda: client.post("/v1/runs", json=one_step("a")))
            assert again.status_code == 503, again.get_json()
        finally:
            _standby_named(url, None)

        # Once commits are confirmed again, the repeat is answered with the run as it is.
        last = client.post("/v1/runs", json=one_step("a"))
        assert last.status_code == 200, last.get_json()
        assert last.get_json()["state"] == "RUNNING"


def _cancelling_each_wait(url: str, request: Callable[[], Any]) -> Any:
    """``request``'s answer, sent from a thread while each of its commits that waits for the
    standby is cancelled as it begins to wait (a submit commits its run, then may notify)."""
    replies: list[Any] = []
    sending = threading.Thread(target=lambda: replies.append(request()))
    sending.start()
    for _ in range(4):
        await_condition(
            lambda: _waiting_for_the_standby(url) or not sending.is_alive(),
            "a commit waiting for the standby, or the request answered",
            30,
        )
        for pid in _waiting_for_the_standby(url):
            _cancel(url, pid)
        sending.join(timeout=0.5)
        if not sending.is_alive():
            break
    sending.join(timeout=30)
    assert not sending.is_alive() and len(replies) == 1
    return replies[0]


def test_a_claims_redelivery_waits_for_the_standby_to_hold_the_claim(
    own_server: RestartablePostgres, tmp_path: Path
) -> None:
    """A claim with the same ``X-Enode-Instance`` gets its step again, read from an earlier
    commit: its answer waits for the standby to hold that commit (cancelled, a 503), and once
    commits are confirmed again it is the same step."""
    url = own_server.new_database()
    instance = {"X-Enode-Instance": "boot-1"}
    with app_on(url, tmp_path / "records", **{"database.pool_size": 1}) as app:
        client = client_of(app)
        advertise(client, "n1", cap("board"), instance="boot-1")
        assert client.post("/v1/runs", json=one_step("a")).status_code == 201
        first = client.post("/v1/nodes/n1/claim?wait=0", headers=instance)
        assert first.status_code == 200, first.get_json()
        _standby_named(url, "standby_that_never_comes")
        try:
            again = _cancelling_each_wait(
                url, lambda: client.post("/v1/nodes/n1/claim?wait=0", headers=instance)
            )
            assert again.status_code == 503, again.get_json()
        finally:
            _standby_named(url, None)
        last = client.post("/v1/nodes/n1/claim?wait=0", headers=instance)
        assert last.status_code == 200 and last.get_json() == first.get_json()


def _advert(node_id: str, drain: str = "") -> dict[str, Any]:
    return {"node_id": node_id, "capabilities": [cap("board")], "policy": {"drain": drain}}


def test_a_renewal_is_soft_state_and_a_significant_advert_waits_for_the_standby(
    own_server: RestartablePostgres, tmp_path: Path
) -> None:
    """A renewal of a live advert that changes nothing commits without waiting for the standby
    (a switch may lose the last ones: the next comes within renew_seconds); a node's first
    advert and a drain set on it wait for the standby like any answer a client acts on."""
    url = own_server.new_database()
    with app_on(url, tmp_path / "records", **{"database.pool_size": 1}) as app:
        client = client_of(app)
        assert client.post("/v1/nodes", json=_advert("n1")).status_code == 200
        _standby_named(url, "standby_that_never_comes")
        try:
            renewal = _cancelling_each_wait(
                url, lambda: client.post("/v1/nodes", json=_advert("n1"))
            )
            assert renewal.status_code == 200, renewal.get_json()
            first = _cancelling_each_wait(url, lambda: client.post("/v1/nodes", json=_advert("n2")))
            assert first.status_code == 503, first.get_json()
            drained = _cancelling_each_wait(
                url, lambda: client.post("/v1/nodes", json=_advert("n1", drain="graceful"))
            )
            assert drained.status_code == 503, drained.get_json()
        finally:
            _standby_named(url, None)
        assert client.post("/v1/nodes", json=_advert("n2")).status_code == 200
