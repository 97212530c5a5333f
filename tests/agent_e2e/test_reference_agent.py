"""``mediator agent`` end to end (docs/api.md#node-agents): a real agent process against a real
gunicorn on PostgreSQL, running real subprocesses. Every wait is a look at the server (or at the
agent's log, or at a file its step writes) with a bounded deadline.

The server heartbeats every second and keeps a lease thirty heartbeats: a step stopped within a
couple of seconds of its cancel was stopped by the heartbeat reply, not by its lease running out.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import yaml

from tests.support.actors import Submitter
from tests.support.agent_process import AgentProcess, LosingProxy, agent_on, node_view
from tests.support.concurrency import await_value
from tests.support.record_contents import record_files
from tests.support.submitter import await_state, run_view

RENEW_SECONDS = 1
live_server_env = {
    "MEDIATOR_LEASE_RENEW_SECONDS": str(RENEW_SECONDS),
    "MEDIATOR_LEASE_NOT_AFTER_FACTOR": "30",
}
PY = sys.executable  # an absolute path: a step's PATH is the agent's minimal one

MAKE = """
import os
print("making the greeting", flush=True)
with open(os.path.join(os.environ["OUT"], "greeting.txt"), "w") as f:
    f.write("hello from make")
"""

CHECK = """
import json, os, sys
text = open(sys.argv[1]).read()
print("checked:", text, flush=True)
json.dump({"ok": text == "hello from make", "got": text}, open(sys.argv[2], "w"))
json.dump(sorted(os.environ), open(os.path.join(os.environ["OUT"], "env.json"), "w"))
"""


def board(run_id: str, *steps: dict, **top: object) -> dict:
    return {
        "run_id": run_id,
        "requires": [{"as": "dut", "capability": "board", "soc": "imx8mp"}],
        "steps": list(steps),
        **top,
    }


def python_step(step_id: str, code: str, *args: str, **fields: object) -> dict:
    return {"id": step_id, "uses": "dut", "run": [PY, "-c", code, *args], **fields}


def submitted(server, doc: dict, status: int = 201) -> None:
    Submitter(server).submit(doc, status)


def test_the_agent_runs_real_steps_and_their_log_and_outputs_reach_the_record(
    live_server, tmp_path
):
    doc = board(
        "agent-run-1",
        python_step("make", MAKE, out=["greeting.txt"]),
        python_step(
            "check",
            CHECK,
            "$IN/greeting.txt",
            "${OUT}/result.json",
            needs=["make"],
            env=["AGENT_E2E_PASSED", "AGENT_E2E_UNSET"],
            out=["result.json", "env.json"],
            schema={"result.json": {"type": "object", "required": ["ok"]}},
            **{"in": {"from": ["greeting.txt"]}},
        ),
        success_when=[{"step": "check", "exit_code": 0, "produced": ["result.json"]}],
    )
    env = {
        "AGENT_E2E_PASSED": "passed through",
        "AGENT_E2E_SECRET": "not for steps",
        "MEDIATOR_TOKEN": "test-token-of-the-mediator-long-enough",  # the token by the environment
    }
    with agent_on(
        live_server.url,
        tmp_path,
        "--node-id",
        "board-1",
        "--capability",
        "board:soc=imx8mp",
        env=env,
        token=False,
    ) as agent:
        agent.await_event("advertised")
        submitted(live_server, doc)
        view = await_state(live_server, "agent-run-1", "SUCCEEDED", "FAILED")
        assert view["state"] == "SUCCEEDED", (view, agent.text()[-3000:])
        assert [s["state"] for s in view["steps"]] == ["DONE", "DONE"]
        assert {s["node"] for s in view["steps"]} == {"board-1"}

        files = record_files(live_server, "agent-run-1")
        assert files["blobs/01.0-greeting.txt"] == b"hello from make"
        assert json.loads(files["blobs/02.0-result.json"]) == {
            "ok": True,
            "got": "hello from make",
        }
        assert b"making the greeting" in files["logs/01-step.log"]
        assert b"checked: hello from make" in files["logs/02-step.log"]
        # The step's environment: what the contract names (set on this node), $IN, $OUT and a
        # minimal PATH; Python itself may add LC_CTYPE in the C locale (PEP 538).
        names = set(json.loads(files["blobs/02.0-env.json"])) - {"LC_CTYPE"}
        assert names == {"AGENT_E2E_PASSED", "IN", "OUT", "PATH"}

        # The run ends when the Mediator commits the last result; the agent logs that its result
        # was taken once the answer reaches it, which may be a moment later.
        agent.await_event("result taken", count=2)
        events = agent.events()
        assert events.count("step taken") == 2 and events.count("step finished") == 2
        assert events.count("result taken") == 2


def test_a_cancelled_step_is_stopped_within_one_heartbeat_and_the_agent_goes_on(
    live_server, tmp_path
):
    pidfile = tmp_path / "pid"
    sleeper = (
        "import os, sys, time\n"
        "print('waiting to be cancelled', flush=True)\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "time.sleep(60)\n"
    )
    with agent_on(
        live_server.url, tmp_path, "--node-id", "board-1", "--capability", "board:soc=imx8mp"
    ) as agent:
        agent.await_event("advertised")
        submitted(live_server, board("agent-cancel-1", python_step("sleep", sleeper, str(pidfile))))
        pid = await_value(
            lambda: pidfile.exists() and pidfile.read_text().isdigit() and int(pidfile.read_text()),
            "the step to start",
        )
        # The log streams while the step runs.
        await_value(
            lambda: (
                b"waiting to be cancelled"
                in live_server.get("/v1/runs/agent-cancel-1/steps/1/log").content
            ),
            "the running step's log to reach the Mediator",
        )
        resp = live_server.post("/v1/runs/agent-cancel-1/cancel")
        assert resp.status_code == 200 and resp.json()["state"] == "FAILED"
        cancelled = time.monotonic()

        def gone() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False

        await_value(gone, "the cancelled step's process to end", timeout=30)
        # One heartbeat, with room for a busy machine: far below the lease's thirty.
        assert time.monotonic() - cancelled < RENEW_SECONDS + 3.0
        stopped = agent.await_event("command stopped")
        assert "lease of agent-cancel-1 ended" in stopped["why"]

        # The node is free again and the agent takes the next run.
        submitted(live_server, board("agent-cancel-2", python_step("quick", "print('quick')")))
        assert await_state(live_server, "agent-cancel-2", "SUCCEEDED", "FAILED")["state"] == (
            "SUCCEEDED"
        )
        assert agent.proc.poll() is None


def test_a_claim_answer_lost_on_the_way_is_redelivered_to_the_same_instance(live_server, tmp_path):
    runs = tmp_path / "runs.txt"
    once = "import sys\nopen(sys.argv[1], 'a').write('ran\\n')\nprint('ran', flush=True)\n"
    with LosingProxy(live_server.url) as proxy:
        with agent_on(
            proxy.url, tmp_path, "--node-id", "board-1", "--capability", "board:soc=imx8mp"
        ) as agent:
            agent.await_event("advertised")
            submitted(live_server, board("agent-lost-1", python_step("once", once, str(runs))))
            view = await_state(live_server, "agent-lost-1", "SUCCEEDED", "FAILED")
            assert view["state"] == "SUCCEEDED", agent.text()[-3000:]
            assert proxy.lost == ["agent-lost-1#01"]
            assert proxy.delivered[0] == "agent-lost-1#01"  # the same step, handed out again
            assert "attempt" not in view["steps"][0]  # still its first attempt
            assert runs.read_text() == "ran\n"  # and run once
            assert "claim failed; asking again" in agent.events()
            instances = {line.get("instance") for line in agent.lines() if line.get("instance")}
            assert len(instances) == 1


def test_sigterm_drains_the_node_finishes_the_step_and_exits_0(live_server, tmp_path):
    marker = tmp_path / "started"
    slow = (
        "import os, sys, time\n"
        "open(sys.argv[1], 'w').write('started')\n"
        "time.sleep(1.5)\n"
        "open(os.path.join(os.environ['OUT'], 'done.txt'), 'w').write('finished')\n"
    )
    agent = AgentProcess(
        live_server.url, tmp_path, "--node-id", "board-1", "--capability", "board:soc=imx8mp"
    )
    try:
        agent.await_event("advertised")
        submitted(
            live_server,
            board(
                "agent-drain-1",
                python_step("slow", slow, str(marker), out=["done.txt"]),
                success_when=[{"step": "slow", "produced": ["done.txt"]}],
            ),
        )
        await_value(marker.exists, "the step to start")
        agent.proc.send_signal(signal.SIGTERM)
        await_value(
            lambda: (node_view(live_server, "board-1") or {}).get("draining"),
            "the node to show draining",
        )
        assert agent.proc.wait(timeout=30) == 0, agent.text()[-3000:]
        assert run_view(live_server, "agent-drain-1")["state"] == "SUCCEEDED"
        assert live_server.get("/v1/runs/agent-drain-1/blob/done.txt").content == b"finished"
        assert node_view(live_server, "board-1")["drain_mode"] == "graceful"
        events = agent.events()
        assert events.index("draining: finishing the running step, then exiting") < events.index(
            "result taken"
        )
    finally:
        agent.stop()


def test_a_drain_file_holds_off_new_work_until_it_is_removed(live_server, tmp_path):
    drain = tmp_path / "drain"
    drain.write_text("")
    with agent_on(
        live_server.url,
        tmp_path,
        "--node-id",
        "board-1",
        "--capability",
        "board:soc=imx8mp",
        "--drain-file",
        str(drain),
    ) as agent:
        agent.await_event("drain file present: taking no new work")
        assert node_view(live_server, "board-1")["drain_mode"] == "graceful"
        submitted(live_server, board("agent-held-1", python_step("work", "print(1)")), status=202)
        drain.unlink()
        view = await_state(live_server, "agent-held-1", "SUCCEEDED", "FAILED")
        assert view["state"] == "SUCCEEDED"
        assert not node_view(live_server, "board-1")["draining"]
        assert "drain file gone: taking work again" in agent.events()


HARNESS = """
import os, sys

# One gunicorn for the module, its tables emptied before each test (tests/conftest.py).
one_server_per_module = True
prompt = open(sys.argv[1]).read()
with open(os.path.join(sys.argv[2], "answer.txt"), "w") as f:
    f.write(prompt.upper())
"""


def test_an_agent_step_runs_the_harness_command_of_the_config_file(live_server, tmp_path):
    config = tmp_path / "agent.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "node_id": "host-1",
                "label": "the lab's reasoning host",
                "capabilities": [{"capability": "agent.reason", "attrs": {"harness": "echo"}}],
                "url": live_server.url,
                "harness": {"name": "echo", "command": [PY, "-c", HARNESS, "$PROMPT", "$OUT"]},
            }
        )
    )
    doc = {
        "run_id": "agent-think-1",
        "requires": [{"as": "host", "capability": "agent.reason", "harness": "echo"}],
        "steps": [
            {
                "id": "think",
                "uses": "host",
                "agent": {"harness": "echo"},
                "in": {"prompt": "say hello"},
                "out": ["answer.txt"],
            }
        ],
        "success_when": [{"step": "think", "produced": ["answer.txt"]}],
    }
    # Everything from the file, the Mediator's address included.
    with agent_on(None, tmp_path, "--config", str(config)) as agent:
        agent.await_event("advertised")
        assert node_view(live_server, "host-1")["label"] == "the lab's reasoning host"
        submitted(live_server, doc)
        view = await_state(live_server, "agent-think-1", "SUCCEEDED", "FAILED")
        assert view["state"] == "SUCCEEDED", agent.text()[-3000:]
        assert live_server.get("/v1/runs/agent-think-1/blob/answer.txt").content == b"SAY HELLO"
