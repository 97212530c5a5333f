"""``mediator node list|drain|resume|quarantine|lift`` against a real gunicorn (docs/client.md):
each a process of its own over real HTTP. An operator holds a board and resumes it, quarantines
it and lifts it, each command printing the node's line afterwards (``--json``: the server's
answer); ``node list`` shows the hold and the health; a token without the operator role gets
the server's 403 reason and exit 5, and nothing changes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from tests.client.cli import complete, mediator
from tests.support.actors import Node, cap
from tests.support.agent import advertise
from tests.support.contracts import one_step
from tests.support.submitter import submit
from tests.support.tokens import ENTRIES, SECRETS

# One gunicorn for the module, its tables emptied before each test (tests/conftest.py); the
# tokens of every role beside the legacy one the client uses by default (an operator).
one_server_per_module = True
live_server_env = {"MEDIATOR_TOKENS": json.dumps(ENTRIES)}

pytestmark = pytest.mark.slow  # processes of the client

HEADER = ["NODE", "LIVE", "LEASE", "RUN", "DRAINING", "HOLD", "HEALTH"]


def line(server: Any, node_id: str) -> dict[str, Any]:
    """The node's line of ``GET /v1/nodes``."""
    nodes = server.get("/v1/nodes").json()["nodes"]
    return next(n for n in nodes if n["node_id"] == node_id)


def rows(stdout: str) -> dict[str, str]:
    """A node table's rows by node id, after its header."""
    lines = stdout.splitlines()
    assert lines[0].split() == HEADER, stdout
    return {row.split()[0]: row for row in lines[1:]}


def ok(result: Any) -> str:
    assert (result.returncode, result.stderr) == (0, ""), (result.returncode, result.stderr)
    return str(result.stdout)


def test_node_drain_holds_the_node_list_shows_it_and_resume_lifts_it(live_server) -> None:
    advertise(live_server, "board-1", cap("board"))
    advertise(live_server, "board-2", cap("board"))

    drained = mediator(live_server, "node", "drain", "board-1", "--reason", "rewiring the rack")

    [row] = rows(ok(drained)).values()
    assert row.split()[:4] == ["board-1", "yes", "-", "graceful"]
    assert row.endswith("graceful by me@lab.test: rewiring the rack  ok")
    hold = line(live_server, "board-1")["hold"]
    assert (hold["mode"], hold["by"], hold["reason"]) == (
        "graceful",
        "me@lab.test",
        "rewiring the rack",
    )

    listed = rows(ok(mediator(live_server, "node", "list")))
    assert list(listed) == ["board-1", "board-2"]
    assert "graceful by me@lab.test: rewiring the rack" in listed["board-1"]
    assert listed["board-2"].split() == ["board-2", "yes", "-", "-", "-", "ok"]

    resumed = rows(ok(mediator(live_server, "node", "resume", "board-1")))
    assert resumed["board-1"].split() == ["board-1", "yes", "-", "-", "-", "ok"]
    assert line(live_server, "board-1")["hold"] is None
    again = mediator(live_server, "node", "resume", "board-1")  # idempotent
    assert rows(ok(again))["board-1"].split() == ["board-1", "yes", "-", "-", "-", "ok"]


def test_node_drain_at_boundary_holds_in_that_mode_and_list_shows_the_lease(live_server) -> None:
    board = Node(live_server, "board-1", "board-1-1")
    board.advertise(cap("board"))
    submit(live_server, one_step("r1"), 201)
    board.claimed(wait=5)  # a step CLAIMED there: the run goes on to its boundary

    drained = mediator(live_server, "node", "drain", "board-1", "--reason", "swap", "--at-boundary")

    row = rows(ok(drained))["board-1"]
    assert row.split()[:4] == ["board-1", "yes", "r1", "at-boundary"]
    assert "at-boundary by me@lab.test: swap" in row
    assert line(live_server, "board-1")["drain_mode"] == "at-boundary"


def test_node_quarantine_and_lift(live_server) -> None:
    advertise(live_server, "board-1", cap("board"))

    quarantined = mediator(live_server, "node", "quarantine", "board-1", "--reason", "flaky hub")

    row = rows(ok(quarantined))["board-1"]
    health = line(live_server, "board-1")["health"]
    assert (health["state"], health["reason"]) == ("quarantined", "flaky hub")
    since = health["since"][:19].replace("T", " ") + "Z"
    assert row.endswith(f"quarantined since {since}: flaky hub")
    assert rows(ok(mediator(live_server, "node", "list")))["board-1"] == row

    lifted = rows(ok(mediator(live_server, "node", "lift", "board-1")))
    assert lifted["board-1"].split() == ["board-1", "yes", "-", "-", "-", "ok"]
    assert line(live_server, "board-1")["health"] == {"state": "ok", "strikes": 0}


def test_node_commands_print_the_servers_line_with_json(live_server) -> None:
    advertise(live_server, "board-1", cap("board"))

    drained = mediator(live_server, "node", "drain", "board-1", "--reason", "r", "--json")
    listed = mediator(live_server, "--json", "node", "list")

    doc = json.loads(ok(drained))
    assert doc == line(live_server, "board-1")
    assert doc["hold"]["reason"] == "r" and doc["health"] == {"state": "ok", "strikes": 0}
    assert [n["node_id"] for n in json.loads(ok(listed))["nodes"]] == ["board-1"]


@pytest.mark.parametrize(
    "args",
    [
        ("drain", "board-1", "--reason", "mine"),
        ("resume", "board-1"),
        ("quarantine", "board-1", "--reason", "mine"),
        ("lift", "board-1"),
    ],
    ids=lambda a: a[0],
)
def test_a_token_without_the_operator_role_gets_the_servers_403_and_exit_5(
    live_server, args
) -> None:
    advertise(live_server, "board-1", cap("board"))
    live_server.post("/v1/nodes/board-1/drain", json={"mode": "graceful", "reason": "ops"})
    live_server.post("/v1/nodes/board-1/quarantine", json={"reason": "ops"})
    before = line(live_server, "board-1")
    reason = requests_reason(live_server, SECRETS["reader"])

    refused = mediator(live_server, "node", *args, MEDIATOR_CLIENT_TOKEN=SECRETS["reader"])

    assert refused.returncode == 5 and refused.stdout == ""
    assert refused.stderr == (
        f"mediator: {reason} (use a token with that role, or --principal / "
        "MEDIATOR_CLIENT_PRINCIPAL)\n"
    )
    assert reason.startswith("token reader lacks the role: operator")
    assert line(live_server, "board-1") == before


def requests_reason(server: Any, secret: str) -> str:
    """The reason of the server's own 403 to that token, asked over the API."""
    resp = requests.post(
        server.url + "/v1/nodes/board-1/drain",
        json={"mode": "graceful", "reason": "x"},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    )
    assert resp.status_code == 403
    return str(resp.json()["error"]["reason"])


def test_the_servers_refusals_of_a_reason_and_a_node_exit_6_with_its_reason(live_server) -> None:
    advertise(live_server, "board-1", cap("board"))

    empty = mediator(live_server, "node", "quarantine", "board-1", "--reason", "")
    unknown = mediator(live_server, "node", "drain", "board-9", "--reason", "x")
    missing = mediator(live_server, "node", "drain", "board-1")

    assert empty.returncode == 6 and empty.stdout == ""
    assert empty.stderr.startswith("mediator: ") and "reason" in empty.stderr
    assert (unknown.returncode, unknown.stderr) == (6, "mediator: no such node: board-9\n")
    assert missing.returncode == 2 and "Missing option '--reason'" in missing.stderr  # usage
    assert line(live_server, "board-1")["health"]["state"] == "ok"
    assert line(live_server, "board-1")["hold"] is None


def test_node_ids_complete_from_the_server_and_nothing_when_it_is_not_there(live_server) -> None:
    advertise(live_server, "board-1", cap("board"))
    advertise(live_server, "board-2", cap("board"))
    advertise(live_server, "host-1", cap("host"))

    drain = complete(live_server, "mediator node drain boa")
    lift = complete(live_server, "mediator node lift ")
    nowhere = complete(None, "mediator node resume boa")

    assert drain.returncode == 0, drain.stderr
    assert drain.stdout.splitlines() == ["plain,board-1", "plain,board-2"]
    assert lift.stdout.splitlines() == ["plain,board-1", "plain,board-2", "plain,host-1"]
    assert (nowhere.returncode, nowhere.stdout.strip(), nowhere.stderr) == (0, "", "")
