"""Claim notifications (docs/design.md#claims-and-the-long-poll): the NOTIFY payload names the nodes
concerned and stays far below PostgreSQL's 8000-byte limit, falling back to ``"*"`` (wake every
waiting claim) past its bound; the process's listener wakes only the named nodes' waiting claims, or
every one for ``"*"``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import app.listener
from app.config import load_config
from app.listener import CLAIM_CHANNEL, ClaimListener
from app.services.notify import notify_claimable

PG_LIMIT = 8000


def ids(n: int, width: int = 30, prefix: str = "node") -> set[str]:
    """``n`` node ids of exactly ``width`` characters."""
    return {f"{prefix}-{k:0{width - len(prefix) - 1}d}" for k in range(n)}


def claim_payload(nodes: set[str]) -> str:
    # Looked up at call time: a module without it fails these tests, not the whole file.
    return app.listener.claim_payload(nodes)


def size(payload: str) -> int:
    return len(payload.encode("utf-8"))


# ---------------------------------------------------------------- claim_payload


def test_the_payload_for_a_few_nodes_is_the_json_list_of_their_ids_sorted():
    payload = claim_payload({"n2", "board-10", "n10", "a"})

    assert json.loads(payload) == ["a", "board-10", "n10", "n2"]


def test_the_payload_for_150_nodes_of_30_characters_still_names_every_node():
    nodes = ids(150)

    payload = claim_payload(nodes)

    assert json.loads(payload) == sorted(nodes)
    assert size(payload) < PG_LIMIT


def test_the_payload_for_600_nodes_of_30_characters_is_the_wake_everyone_star():
    payload = claim_payload(ids(600))

    assert json.loads(payload) == "*"


@pytest.mark.parametrize(
    "nodes",
    [
        pytest.param(ids(n), id=f"{n}x30")
        for n in (1, 50, 150, 190, 200, 205, 210, 220, 250, 600, 5000)
    ]
    + [pytest.param(ids(n, 200), id=f"{n}x200") for n in (1, 30, 34, 35, 36, 40, 100)]
    + [
        # Non-ASCII ids: the limit is in bytes, whatever the JSON escaping makes of them.
        pytest.param({f"knoten-ä€-{k:03d}-" + "é" * 150 for k in range(n)}, id=f"{n}xnon-ascii")
        for n in (1, 5, 8, 10, 12, 20, 60)
    ],
)
def test_the_payload_always_stays_below_postgresqls_8000_byte_limit(nodes):
    payload = claim_payload(nodes)

    assert size(payload) < PG_LIMIT
    parsed = json.loads(payload)
    assert parsed == "*" or parsed == sorted(nodes)


def test_notify_claimable_sends_the_star_on_the_claim_channel_for_600_nodes(ctx, sql):
    # The NOTIFY itself, received by a real LISTEN on the database: past the bound, the payload is
    # the "*" that wakes every waiting claim (a longer one would be refused by PostgreSQL and the
    # waiting claims would hear nothing).
    sql.execute(f"LISTEN {CLAIM_CHANNEL}")

    notify_claimable(ctx, ids(600))

    note = next(sql.notifies(timeout=5, stop_after=1), None)
    assert note is not None, "no notification arrived"
    assert note.channel == CLAIM_CHANNEL and json.loads(note.payload) == "*"


def test_notify_claimable_names_the_nodes_on_the_claim_channel(ctx, sql):
    sql.execute(f"LISTEN {CLAIM_CHANNEL}")

    notify_claimable(ctx, {"n2", "n1"})

    note = next(sql.notifies(timeout=5, stop_after=1), None)
    assert note is not None, "no notification arrived"
    assert json.loads(note.payload) == ["n1", "n2"]


# ---------------------------------------------------------------- several requests together


def claim_payloads(requests: list[set[str]]) -> list[str]:
    return app.listener.claim_payloads(requests)


def test_the_nodes_of_several_requests_go_in_one_payload_when_they_fit():
    payloads = claim_payloads([{"n2", "n1"}, {"n3", "n1"}])

    assert [json.loads(p) for p in payloads] == [["n1", "n2", "n3"]]


def test_a_request_that_wakes_every_claim_makes_the_star_alone():
    payloads = claim_payloads([{"n1"}, ids(600)])

    assert [json.loads(p) for p in payloads] == ["*"]


@pytest.mark.parametrize(("count", "width"), [(150, 30), (30, 200)])
def test_merged_requests_too_many_for_one_payload_are_split_and_never_become_the_star(count, width):
    # Each request names its nodes by itself; together they are several payloads' worth.
    requests = [ids(count, width, prefix=f"r{k}") for k in range(8)]
    assert all(json.loads(claim_payload(r)) != "*" for r in requests)

    payloads = claim_payloads(requests)

    assert len(payloads) > 1
    assert all(size(p) <= 7000 for p in payloads)
    named = [n for p in payloads for n in json.loads(p)]
    assert named == sorted(set().union(*requests))


def test_the_notifier_sends_what_requests_hand_over_on_the_claim_channel(ctx, sql):
    sql.execute(f"LISTEN {CLAIM_CHANNEL}")

    ctx.notifier.send({"n2", "n1"})
    ctx.notifier.send({"n3"})

    named: set[str] = set()
    for note in sql.notifies(timeout=5):
        assert note.channel == CLAIM_CHANNEL
        named |= set(json.loads(note.payload))
        if named == {"n1", "n2", "n3"}:
            break
    assert named == {"n1", "n2", "n3"}


# ---------------------------------------------------------------- the listener


@pytest.fixture
def listener(db_url: str) -> Iterator[ClaimListener]:
    config = load_config(env={}, overrides={"database.url": db_url})
    claims = ClaimListener(config)
    try:
        # The first registration starts the listener thread, and a listener that (re)connects
        # wakes every waiter: let that happen before the tickets under test exist.
        warm_up = claims.register("warm-up")
        assert claims.connected.wait(10), "the claim listener never connected"
        claims.unregister("warm-up", warm_up)
        yield claims
    finally:
        claims.close()


def tickets(listener: ClaimListener, *nodes: str) -> dict[str, list[threading.Event]]:
    """Two waiting claims per node."""
    return {n: [listener.register(n), listener.register(n)] for n in nodes}


def woken(waiting: dict[str, list[threading.Event]]) -> dict[str, list[bool]]:
    return {n: [t.is_set() for t in ts] for n, ts in waiting.items()}


def test_a_list_payload_nudges_only_the_named_nodes_waiting_claims(listener: Any):
    waiting = tickets(listener, "n1", "n2", "n3")

    listener._handle(json.dumps(["n1", "n3", "n9"]))

    assert woken(waiting) == {"n1": [True, True], "n2": [False, False], "n3": [True, True]}


def test_the_star_payload_nudges_every_waiting_claim(listener: Any):
    waiting = tickets(listener, "n1", "n2", "n3")

    listener._handle('"*"')

    assert woken(waiting) == {n: [True, True] for n in ("n1", "n2", "n3")}


def test_the_payload_claim_payload_makes_for_600_nodes_nudges_every_waiting_claim(listener: Any):
    # The two ends agree: a waiting claim on a node outside the 600 is woken too, because the
    # payload no longer names anyone.
    waiting = tickets(listener, "n1", "n2")

    listener._handle(claim_payload(ids(600)))

    assert woken(waiting) == {"n1": [True, True], "n2": [True, True]}


def test_the_payload_claim_payload_makes_for_a_few_nodes_nudges_only_those(listener: Any):
    waiting = tickets(listener, "n1", "n2")

    listener._handle(claim_payload({"n2"}))

    assert woken(waiting) == {"n1": [False, False], "n2": [True, True]}
