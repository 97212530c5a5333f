"""The reference agent with a node token bound to its node id, against gunicorn configured with
tokens alone: it advertises, claims, uploads and reports for its node; an agent whose token is
bound to another node gets no node registered and no work."""

from __future__ import annotations

import json
import sys

from app.tokens import new_token
from tests.support.agent_process import agent_on
from tests.support.apps import gunicorn_on
from tests.support.concurrency import await_value
from tests.support.submitter import await_state

PY = sys.executable


def test_an_agent_with_a_bound_node_token_runs_its_step(fresh_db_url, tmp_path):
    mine = new_token("bench-1", ["node"], nodes=["bench-1"])
    ops = new_token("ops", ["operator"])
    env = {
        "MEDIATOR_TOKEN": "",
        "MEDIATOR_TOKENS": json.dumps([mine.entry, ops.entry]),
        "MEDIATOR_LEASE_RENEW_SECONDS": "1",
    }
    with gunicorn_on(fresh_db_url, tmp_path, **env) as server:
        auth = {"Authorization": f"Bearer {ops.secret}"}
        server.headers = lambda **extra: {**auth, **extra}  # the test's requests: an operator
        code = "import os; open(os.path.join(os.environ['OUT'], 'o.txt'), 'w').write('done')"
        doc = {
            "run_id": "r1",
            "requires": [{"as": "dut", "capability": "board"}],
            "steps": [{"id": "s", "uses": "dut", "run": [PY, "-c", code], "out": ["o.txt"]}],
        }
        args = ("--node-id", "bench-1", "--capability", "board", "--token", mine.secret)
        with agent_on(server.url, tmp_path, *args, token=False) as agent:
            agent.await_event("advertised")
            assert server.post("/v1/runs", doc).status_code == 201
            view = await_state(server, "r1", "SUCCEEDED", "FAILED")
            assert view["state"] == "SUCCEEDED", (view, agent.text()[-3000:])
            assert [s["node"] for s in view["steps"]] == ["bench-1"]
            ledger = server.get("/v1/runs/r1/ledger").json()["entries"]
            assert [e["name"] for e in ledger] == ["o.txt"]
        assert mine.secret not in agent.text()

        other = ("--node-id", "bench-2", "--capability", "board", "--token", mine.secret)
        with agent_on(server.url, tmp_path, *other, token=False) as intruder:
            await_value(
                lambda: any("403" in json.dumps(line) for line in intruder.lines()),
                "the agent to be refused",
            )
            nodes = [n["node_id"] for n in server.get("/v1/nodes").json()["nodes"]]
            # bench-1 may be listed or not (its advert lives 3 s after its agent stopped, which a
            # busy machine can outlast); bench-2 must never be.
            assert "bench-2" not in nodes
