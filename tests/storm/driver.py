"""One process of the storm: ``python -m tests.storm.driver ROLE --index I --seed S ...``.

Roles:
- ``submitter``: submits runs of many shapes (one and two steps, two roles and a release, acquire
  steps after a step, at creation and right after a release, two-node roles, loops, asks with a
  deadline, queue timeouts, runs no node can take),
  resubmits known run ids, sends invalid contracts and dry-runs, reads runs and lists.
- ``canceller``: cancels QUEUED and RUNNING runs it finds in the lists (and unknown ones), answers
  open asks (some against their schema), reads the node list.
- ``nodes``: a few node agents: adverts as heartbeats, drains (graceful, at-boundary) and their
  lifting, restarts (a new instance id, the claimed step forgotten; every tenth operation one of
  a node holding a claimed step, until a few were made), capability changes, going
  silent past their lease window and coming back, claims, logs and blobs, results (exit 0,
  failures, errors, a late or duplicated report).
- ``reaper``: ``reap_pass`` in a loop on the same database as the server.

Every HTTP answer is checked against the statuses its route documents; an error body must be
the Mediator's one error shape with the same code. At the end (its operations done, its time up,
or SIGTERM) the process writes a JSON summary to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
import traceback
from collections import Counter
from typing import Any, TypeGuard

import requests

TOKEN_HEADER = "Authorization"

# Documented statuses per route (docs/api.md#conventions). 503 is allowed everywhere: overload
# answers it (a full pool, the database away) and it is counted apart.
ALLOWED: dict[str, set[int]] = {
    "advert": {200, 400},
    "claim": {200, 204},
    "result": {200, 400, 409},
    "submit": {200, 201, 202, 400, 422},
    "dry-run": {200, 400, 422},
    "run": {200, 404},
    "runs": {200, 400},
    "cancel": {200, 404},
    "log": {200, 404, 409, 410},
    "blob": {204, 404, 409, 410, 413, 422},
    "asks": {200},
    "answer": {200, 403, 409, 422},
    "nodes": {200},
}
OVERLOAD = 503
DEEP_QUEUE = 60  # QUEUED runs past which a submitter stops adding more for a while
SOCS = ("a", "b")


class Client:
    """Requests to the Mediator, each on a new connection (gunicorn hands each to whichever
    worker accepts it), every answer tallied and checked. ``base`` may name several hosts,
    comma-separated: each request goes to one of them, drawn from ``seed``'s stream."""

    def __init__(self, base: str, token: str, seed: str = "") -> None:
        self.bases = [b for b in base.split(",") if b]
        self.pick = random.Random(f"{seed}/hosts")
        self.headers = {TOKEN_HEADER: f"Bearer {token}"}
        self.tally: Counter[str] = Counter()
        self.latency: dict[str, list[float]] = {}
        self.unexpected: list[str] = []
        self.no_answer: list[str] = []
        self.requests = 0

    def call(
        self,
        route: str,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> requests.Response | None:
        self.requests += 1
        began = time.monotonic()
        try:
            resp = requests.request(
                method,
                self.pick.choice(self.bases) + path,
                json=json_body,
                data=data,
                headers={**self.headers, **(headers or {})},
                timeout=timeout,
            )
        except requests.RequestException as exc:
            self.no_answer.append(f"{method} {path}: {type(exc).__name__}: {exc}")
            return None
        status = resp.status_code
        self.tally[f"{route} {status}"] += 1
        self.latency.setdefault(route, []).append(time.monotonic() - began)
        if status != OVERLOAD and status not in ALLOWED[route]:
            self.unexpected.append(f"{method} {path} -> {status}: {resp.text[:300]}")
        elif status >= 400:
            try:
                body = resp.json()
                ok = set(body) == {"error"} and body["error"]["code"] == status
                ok = ok and isinstance(body["error"]["reason"], str)
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                self.unexpected.append(
                    f"{method} {path} -> {status} without the error body: {resp.text[:300]}"
                )
        return resp


# ---------------------------------------------------------------- contracts


def board(name: str = "dut", **attrs: str) -> dict[str, Any]:
    return {"as": name, "capability": "board", **attrs}


def shapes(rng: random.Random, run_id: str) -> dict[str, Any]:
    """A random valid contract."""
    kind = rng.choice(
        [
            "one",
            "one",
            "one-soc",
            "two",
            "release",
            "acquire",
            "acquires-crossed",
            "release-acquire",
            "wide",
            "loop",
            "ask",
            "timeout",
            "out",
            "scope",
        ]
    )
    doc: dict[str, Any] = {"run_id": run_id}
    if kind == "one":
        doc["requires"] = [board()]
        doc["steps"] = [{"id": "work", "uses": "dut", "run": ["work"]}]
    elif kind == "one-soc":
        doc["requires"] = [board(soc=rng.choice(SOCS))]
        doc["steps"] = [{"id": "work", "uses": "dut", "run": ["work"]}]
    elif kind == "two":
        doc["requires"] = [board()]
        doc["steps"] = [
            {"id": "flash", "uses": "dut", "run": ["flash"]},
            {"id": "boot", "uses": "dut", "run": ["boot"]},
        ]
    elif kind == "release":
        doc["requires"] = [board(), {"as": "host", "capability": "host"}]
        doc["steps"] = [
            {"id": "flash", "uses": "dut", "run": ["flash"], "release": ["dut"]},
            {"id": "report", "uses": "host", "run": ["report"]},
        ]
    elif kind == "acquire":
        doc["requires"] = [{"as": "host", "capability": "host"}]
        doc["steps"] = [
            {"id": "prep", "uses": "host", "run": ["prep"]},
            {
                "id": "grab",
                "acquire": {
                    "want": {"as": "extra", "capability": "board"},
                    "acquired": "measure",
                    "unavailable": "fallback",
                },
            },
            {"id": "measure", "uses": "extra", "run": ["measure"]},
            {"id": "fallback", "uses": "host", "run": ["fallback"], "needs": ["grab"]},
        ]
    elif kind == "release-acquire":
        # The acquire runs in the transaction of the result that released a board, and may get
        # that very board back (the lock order's exception for a release, docs/queue.md).
        doc["requires"] = [board(), {"as": "host", "capability": "host"}]
        doc["steps"] = [
            {"id": "flash", "uses": "dut", "run": ["flash"], "release": ["dut"]},
            {
                "id": "grab",
                "acquire": {
                    "want": {"as": "again", "capability": "board"},
                    "acquired": "measure",
                    "unavailable": "fallback",
                },
            },
            {"id": "measure", "uses": "again", "run": ["measure"]},
            {"id": "fallback", "uses": "host", "run": ["fallback"], "needs": ["grab"]},
        ]
    elif kind == "acquires-crossed":
        # Two acquires whose targets cross: both follow-ups end SKIPPED, so the run can end
        # inside its own promotion (the steps all settle at once).
        doc["requires"] = [board()]
        doc["steps"] = [
            {
                "id": "grab-a",
                "needs": [],
                "acquire": {
                    "want": {"as": "xa", "capability": "scope"},
                    "acquired": "use-b",
                    "unavailable": "use-a",
                },
            },
            {
                "id": "grab-b",
                "needs": [],
                "acquire": {
                    "want": {"as": "xb", "capability": "scope"},
                    "acquired": "use-a",
                    "unavailable": "use-b",
                },
            },
            {"id": "use-a", "uses": "dut", "run": ["a"], "needs": ["grab-a", "grab-b"]},
            {"id": "use-b", "uses": "dut", "run": ["b"], "needs": ["grab-a", "grab-b"]},
        ]
    elif kind == "wide":
        doc["requires"] = [{"as": "dut", "capability": "board", "count": 2}]
        doc["steps"] = [{"id": "work", "uses": "dut", "run": ["work"]}]
    elif kind == "loop":
        doc["requires"] = [board()]
        doc["steps"] = [
            {"id": "build", "uses": "dut", "run": ["make"]},
            {
                "id": "test",
                "uses": "dut",
                "run": ["check"],
                "loop": {"back_to": "build", "max": 3, "until": {"exit_code": 0}},
            },
        ]
        doc["success_when"] = [{"step": "test", "exit_code": 0}]
    elif kind == "ask":
        doc["requires"] = [board()]
        doc["steps"] = [
            {"id": "flash", "uses": "dut", "run": ["flash"]},
            {
                "id": "approve",
                "ask": {
                    "prompt": "Looks right?",
                    "timeout": {"after": rng.choice(["2s", "30s"]), "then": "fail"},
                },
                "out": ["decision"],
                "schema": {
                    "decision": {
                        "type": "object",
                        "required": ["verdict"],
                        "properties": {"verdict": {"enum": ["approve", "reject"]}},
                    }
                },
            },
        ]
    elif kind == "timeout":
        doc["requires"] = [board(soc=rng.choice(SOCS))]
        doc["steps"] = [{"id": "work", "uses": "dut", "run": ["work"]}]
        doc["queue"] = {"timeout": "2s"}
    elif kind == "out":
        doc["requires"] = [board()]
        doc["steps"] = [
            {
                "id": "boot",
                "uses": "dut",
                "run": ["boot"],
                "out": ["result.json"],
                "schema": {
                    "result.json": {
                        "type": "object",
                        "required": ["ok"],
                        "properties": {"ok": {"type": "boolean"}},
                    }
                },
            }
        ]
        doc["success_when"] = [{"step": "boot", "exit_code": 0, "produced": ["result.json"]}]
    else:  # a scope: only some nodes advertise one, some of the time (else 422 FAILED)
        doc["requires"] = [{"as": "probe", "capability": "scope"}]
        doc["steps"] = [{"id": "measure", "uses": "probe", "run": ["measure"]}]
    return doc


INVALID: list[Any] = [
    {"run_id": "bad id with spaces", "requires": [board()], "steps": [{"id": "a", "run": ["x"]}]},
    {"run_id": "x", "requires": [], "steps": []},
    {"run_id": "y", "requires": [board()], "steps": [{"id": "a", "uses": "dutt", "run": ["x"]}]},
    [1, 2, 3],
    {"run_id": "z", "requires": [{"as": "dut", "capability": "board", "count": 0}], "steps": []},
]


# ---------------------------------------------------------------- the roles


class Stop(Exception):
    pass


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(f"{args.seed}/{args.role}/{args.index}")
        self.client = Client(args.url, args.token, f"{args.seed}/{args.role}/{args.index}")
        self.ops = 0
        self.started = time.monotonic()
        self.stopping = False
        self.errors: list[str] = []
        self.notes: Counter[str] = Counter()

    def more(self) -> bool:
        """Another operation? A fixed number, or until ``--seconds`` (soak) have passed; never
        past ``--deadline`` (a guard for a slow machine) or after SIGTERM."""
        if self.stopping:
            return False
        elapsed = time.monotonic() - self.started
        if self.args.deadline and elapsed > self.args.deadline:
            self.notes["cut short by the deadline"] += 1
            return False
        if self.args.seconds:
            return elapsed < self.args.seconds
        return self.ops < self.args.ops

    def run(self) -> None:
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:
        return {
            "role": self.args.role,
            "index": self.args.index,
            "ops": self.ops,
            "requests": self.client.requests,
            "seconds": round(time.monotonic() - self.started, 2),
            "tally": dict(self.client.tally),
            "latency": self.client.latency,
            "unexpected": self.client.unexpected[:50],
            "unexpected_count": len(self.client.unexpected),
            "no_answer": self.client.no_answer[:50],
            "no_answer_count": len(self.client.no_answer),
            "errors": self.errors[:20],
            "notes": dict(self.notes),
        }


class Submitter(Driver):
    def run(self) -> None:
        known: list[str] = []
        n = 0
        while self.more():
            self.ops += 1
            roll = self.rng.random()
            c = self.client
            if self.ops % 20 == 0 and self._queue_is_deep():
                # Keep a long soak a storm, not a backlog: while the queue is deep, only read.
                self.notes["backed off"] += 1
                time.sleep(0.5)
            elif roll < 0.62 or not known:
                n += 1
                run_id = f"r{self.args.index}-{n}"
                resp = c.call("submit", "POST", "/v1/runs", json_body=self._contract(run_id))
                if resp is not None and resp.status_code in (201, 202, 422):
                    known.append(run_id)
            elif roll < 0.70:
                c.call("submit", "POST", "/v1/runs", json_body=self._resubmit(known))
            elif roll < 0.74:
                c.call("submit", "POST", "/v1/runs", json_body=self.rng.choice(INVALID))
            elif roll < 0.78:
                doc = shapes(self.rng, f"dry-{self.args.index}-{self.ops}")
                c.call("dry-run", "POST", "/v1/runs/dry-run", json_body=doc)
            elif roll < 0.90:
                c.call("run", "GET", f"/v1/runs/{self.rng.choice(known)}")
            elif roll < 0.97:
                state = self.rng.choice(["QUEUED", "RUNNING", "FAILED", "SUCCEEDED", ""])
                c.call("runs", "GET", f"/v1/runs?state={state}&limit=20")
            else:
                c.call("runs", "GET", "/v1/runs?limit=notanumber")
            time.sleep(self.rng.uniform(0, self.args.pause))

    def _contract(self, run_id: str) -> dict[str, Any]:
        doc = shapes(self.rng, run_id)
        if self.args.priorities:
            # Mostly the default, some urgent, some background runs (docs/priorities.md#priority).
            priority = self.rng.choice([-10, 0, 0, 0, 20])
            doc["queue"] = {**doc.get("queue", {}), "priority": priority}
        return doc

    def _queue_is_deep(self) -> bool:
        resp = self.client.call("runs", "GET", f"/v1/runs?state=QUEUED&limit={DEEP_QUEUE}")
        return _ok(resp) and len(resp.json().get("runs", [])) >= DEEP_QUEUE

    def _resubmit(self, known: list[str]) -> dict[str, Any]:
        # The run_id is the idempotency key: the body is not compared (200 with the run).
        return shapes(self.rng, self.rng.choice(known))


class Canceller(Driver):
    def run(self) -> None:
        c = self.client
        while self.more():
            self.ops += 1
            roll = self.rng.random()
            if roll < 0.45:
                state = self.rng.choice(["QUEUED", "RUNNING", "RUNNING"])
                resp = c.call("runs", "GET", f"/v1/runs?state={state}&limit=30")
                runs = resp.json().get("runs", []) if _ok(resp) else []
                if runs and self.rng.random() < 0.5:
                    victim = self.rng.choice(runs)["run_id"]
                    c.call("cancel", "POST", f"/v1/runs/{victim}/cancel")
            elif roll < 0.50:
                c.call("cancel", "POST", f"/v1/runs/no-such-run-{self.ops}/cancel")
            elif roll < 0.85:
                resp = c.call("asks", "GET", "/v1/asks")
                asks = resp.json().get("asks", []) if _ok(resp) else []
                if asks:
                    ask = self.rng.choice(asks)
                    verdict = self.rng.choice(["approve", "approve", "reject", "maybe"])
                    c.call(
                        "answer",
                        "POST",
                        f"/v1/runs/{ask['run_id']}/steps/{ask['seq']}/answer",
                        json_body={"verdict": verdict},
                        headers={"X-Enode-Principal": "qa@example.com"},
                    )
            else:
                c.call("nodes", "GET", "/v1/nodes")
            time.sleep(self.rng.uniform(0, self.args.pause))


def _ok(resp: requests.Response | None) -> TypeGuard[requests.Response]:
    return resp is not None and resp.status_code == 200


class Node:
    def __init__(self, node_id: str, rng: random.Random) -> None:
        self.node_id = node_id
        self.instance = f"{node_id}-i0"
        self.restarts = 0
        self.caps: list[dict[str, Any]] = [{"capability": "board", "attrs": {}}]
        self.reshape(rng)
        self.drain = ""
        self.silent_until = 0.0
        self.last_advert = 0.0
        self.step: dict[str, Any] | None = None  # claimed, not reported yet
        self.reported: dict[str, Any] | None = None  # the last accepted report (for a duplicate)

    def reshape(self, rng: random.Random) -> None:
        """A capability change: a board of another soc, sometimes a host, sometimes a scope."""
        caps: list[dict[str, Any]] = [
            {"capability": "board", "attrs": {"soc": rng.choice(SOCS)}}
            if rng.random() < 0.7
            else {"capability": "board", "attrs": {}}
        ]
        if rng.random() < 0.4:
            caps.append({"capability": "host", "attrs": {}})
        if rng.random() < 0.15:
            caps.append({"capability": "scope", "attrs": {}})
        self.caps = caps


NODE_ACTIONS = ("work", "drain", "restart", "reshape", "duplicate", "bad advert")
NODE_WEIGHTS = (86, 5, 2, 3, 3, 1)
# Restarts of a node that holds a claimed step (restart detection fails its run), made on every
# tenth operation while one holds a step, until this many were made.
RESTARTS_MID_STEP = 3


class Nodes(Driver):
    def run(self) -> None:
        nodes = [Node(f"n{self.args.index}-{k}", self.rng) for k in range(self.args.nodes)]
        for node in nodes:
            self.advertise(node)
        while self.more():
            self.ops += 1
            now = time.monotonic()
            for node in nodes:  # heartbeats: every node well inside its window
                if now >= node.silent_until and now - node.last_advert > self.args.heartbeat:
                    self.advertise(node)
            node = self.rng.choice(nodes)
            busy = [n for n in nodes if n.step is not None and now >= n.silent_until]
            if busy and self.ops % 10 == 0 and self.notes["restarts mid-step"] < RESTARTS_MID_STEP:
                self.notes["restarts mid-step"] += 1
                self.restart(self.rng.choice(busy))
                continue
            if now < node.silent_until:
                continue
            action = self.rng.choices(NODE_ACTIONS, NODE_WEIGHTS)[0]
            if action == "drain" and not node.drain:
                node.drain = self.rng.choice(["graceful", "at-boundary"])
                self.notes[f"drain {node.drain}"] += 1
                self.advertise(node)
            elif action == "drain":
                node.drain = ""  # lifted: a wake
                self.advertise(node)
            elif action == "restart":
                self.restart(node)
            elif action == "reshape":
                node.reshape(self.rng)
                self.notes["capability changes"] += 1
                self.advertise(node)
            elif action == "duplicate" and node.reported is not None and node.step is None:
                self.report(node, node.reported, duplicate=True)
            elif action == "bad advert":
                self.client.call("advert", "POST", "/v1/nodes", json_body={"capabilities": []})
            elif node.step is not None and self.rng.random() < 0.05:
                self.die(node, now)
            elif node.step is not None:
                if self.rng.random() < 0.85:  # sometimes the step takes a while
                    self.finish_step(node)
            else:
                self.claim(node)
            time.sleep(self.rng.uniform(0, self.args.pause))
        # The storm ends with every node back, live and not draining: the queue's wake points
        # (drain lifted, capacity appeared) must then leave no run waiting that fits a free one.
        for node in nodes:
            node.drain = ""
            self.advertise(node)

    def restart(self, node: Node) -> None:
        """A new instance id, the claimed step forgotten: restart detection fails the run of a
        step it held (docs/queue.md, "Crashes and restarts")."""
        node.restarts += 1
        node.instance = f"{node.node_id}-i{node.restarts}"
        node.step = None  # a restarted agent forgets what it was doing
        self.notes["restarts"] += 1
        self.advertise(node)

    def die(self, node: Node, now: float) -> None:
        """The agent dies in the middle of a step and stays silent past the lease window: its
        leases expire and the reaper fails the run. It comes back as capacity appearing,
        restarted or not."""
        node.silent_until = now + self.args.silence
        node.step = None
        if self.rng.random() < 0.5:
            node.restarts += 1
            node.instance = f"{node.node_id}-i{node.restarts}"
        self.notes["went silent"] += 1

    def advertise(self, node: Node) -> None:
        body = {
            "node_id": node.node_id,
            "instance": node.instance,
            "capabilities": node.caps,
            "policy": {"drain": node.drain},
        }
        resp = self.client.call("advert", "POST", "/v1/nodes", json_body=body)
        if _ok(resp):
            node.last_advert = time.monotonic()

    def claim(self, node: Node) -> None:
        wait = self.rng.choice([0, 0, 0, 0.2])
        resp = self.client.call(
            "claim",
            "POST",
            f"/v1/nodes/{node.node_id}/claim?wait={wait}",
            headers={"X-Enode-Instance": node.instance},
            timeout=30 + wait,
        )
        if _ok(resp):
            node.step = resp.json()
            self.notes["claimed"] += 1
        elif resp is not None and resp.status_code == 204 and wait == 0:
            time.sleep(0.02)  # nothing to do: an idle agent waits a little

    def finish_step(self, node: Node) -> None:
        step = node.step
        assert step is not None
        base = f"/v1/runs/{step['run_id']}/steps/{step['seq']}"
        if self.rng.random() < 0.5:
            self.client.call("log", "PUT", f"{base}/log?name=step", data=b"line one\nline two\n")
        produced: list[str] = []
        for name in step.get("out") or []:
            good = self.rng.random() < 0.85
            blob = json.dumps({"ok": True} if good else {"ok": "yes"}).encode()
            resp = self.client.call("blob", "PUT", f"{base}/blob/{name}", data=blob)
            if resp is not None and resp.status_code == 204:
                produced.append(name)
        roll = self.rng.random()
        body: dict[str, Any] = {"node": node.node_id, "produced": produced}
        if step.get("lease", {}).get("nonce"):
            body["nonce"] = step["lease"]["nonce"]
        if roll < 0.75:
            body["exit_code"] = 0
        elif roll < 0.90:
            body["exit_code"] = self.rng.choice([1, 2, 137])
        elif roll < 0.95:
            body["exit_code"] = 3221225477  # Windows' 0xC0000005
        else:
            body["error"] = "agent: the command could not start"
        self.report(node, {"step": step, "body": body})
        node.step = None

    def report(self, node: Node, report: dict[str, Any], *, duplicate: bool = False) -> None:
        step, body = report["step"], report["body"]
        resp = self.client.call(
            "result",
            "POST",
            f"/v1/runs/{step['run_id']}/steps/{step['seq']}/result",
            json_body=body,
        )
        if resp is not None and resp.status_code == 200 and not duplicate:
            node.reported = report
            self.notes["reported"] += 1
        elif duplicate and resp is not None and resp.status_code == 200:
            # A duplicate of an accepted result is 409
            # (docs/api.md#post-v1runsrun_idstepsseqresult--report-a-steps-result): the step could
            # be CLAIMED again only by this node's own claim, and a node sends duplicates only while
            # it holds no claimed step.
            self.errors.append(f"a duplicated result was accepted: {step['run_id']}#{step['seq']}")


class Reaper(Driver):
    def run(self) -> None:
        from app import create_app
        from app.services.reaper import reap_pass
        from tests.support.apps import make_config

        config = make_config(
            self.args.db,
            self.args.records,
            **{
                "lease.renew_seconds": self.args.renew,
                "log.level": "error",
                "queue.reserve_after_seconds": self.args.reserve_after,
            },
            **json.loads(self.args.store),
        )
        app = create_app(config)
        ctx = app.extensions["mediator"]
        failed = False
        try:
            while self.more():
                self.ops += 1
                try:
                    report = reap_pass(ctx, previous_failed=failed)
                    failed = False
                    self.notes["skipped" if report.skipped else "passes"] += 1
                    if report.woke:
                        self.notes["woke"] += 1
                    self.notes["lease expired"] += len(report.lease_expired)
                    self.notes["queue timeouts"] += len(report.queue_timeouts)
                    self.notes["asks expired"] += report.asks_expired
                    self.notes["sealed"] += report.sealed
                except Exception:
                    failed = True
                    self.errors.append(traceback.format_exc(limit=5))
                time.sleep(self.args.pause)
        finally:
            ctx.close()


ROLES: dict[str, type[Driver]] = {
    "submitter": Submitter,
    "canceller": Canceller,
    "nodes": Nodes,
    "reaper": Reaper,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.storm.driver")
    p.add_argument("role", choices=sorted(ROLES))
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--url", required=True, help="the Mediator's base URL (or several, by commas)")
    p.add_argument("--token", required=True)
    p.add_argument("--db", required=True, help="the database URL (the reaper)")
    p.add_argument("--records", required=True, help="the Record store's root (the reaper)")
    p.add_argument("--store", default="{}", help="Record store keys as JSON (the reaper)")
    p.add_argument("--out", required=True, help="where the JSON summary goes")
    p.add_argument("--ops", type=int, default=100, help="operations, when not --seconds")
    p.add_argument("--seconds", type=float, default=0.0, help="run this long instead (soak)")
    p.add_argument("--deadline", type=float, default=0.0, help="stop after this in any case")
    p.add_argument("--pause", type=float, default=0.01, help="longest pause between operations")
    p.add_argument("--nodes", type=int, default=3, help="node agents of a nodes process")
    p.add_argument("--heartbeat", type=float, default=1.0, help="seconds between adverts")
    p.add_argument("--silence", type=float, default=7.0, help="how long a silent node is away")
    p.add_argument("--renew", type=int, default=2, help="lease.renew_seconds of the server")
    p.add_argument(
        "--reserve-after", type=int, default=900, help="queue.reserve_after_seconds (the reaper)"
    )
    p.add_argument("--priorities", action="store_true", help="submit runs of several priorities")
    args = p.parse_args(argv)
    driver = ROLES[args.role](args)

    def stop(*_: Any) -> None:
        driver.stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        driver.run()
    except Exception:
        driver.errors.append(traceback.format_exc(limit=8))
    with open(args.out, "w") as f:
        json.dump(driver.summary(), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
