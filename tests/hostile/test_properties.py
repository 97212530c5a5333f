"""Hostile input, generated (bad input is a 4xx with a reason, never a 500:
docs/security.md#input-and-load): contracts, adverts, step results, answers, query parameters and
headers built by Hypothesis (``tests/support/strategies.py``) and sent to the app. Each answer is a
2xx or a 4xx — never a 5xx — and every 4xx has the one JSON error body. The results and answers go
to a step that really is claimed or asked, so they reach the code behind the first checks.

The number of inputs is the Hypothesis profile's (``ci`` by default; ``HYPOTHESIS_PROFILE=long``
for many more, see docs/reliability.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support import strategies as hs
from tests.support.rows import step_row

# The app's own examples share one app and one database; function-scoped fixtures are meant.
SETTINGS = settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)


# A claim that asks for a long wait must not hold the test for the default 30 s window.
pytestmark = pytest.mark.config({"claim.long_poll_seconds": 0.2, "claim.recheck_seconds": 0.1})


def encoded(doc: Any) -> bytes:
    """JSON as a client sends it; a lone surrogate goes as its ``\\ud800`` escape."""
    return json.dumps(doc).encode()


def check_answer(resp: Any, what: Any) -> None:
    event(f"status {resp.status_code}")
    assert resp.status_code < 500, (what, resp.status_code, resp.get_data()[:300])
    if resp.status_code >= 400:
        body = resp.get_json(silent=True)
        assert isinstance(body, dict) and set(body) == {"error"}, (what, resp.get_data()[:300])
        assert body["error"]["code"] == resp.status_code, (what, body)
        assert isinstance(body["error"]["reason"], str) and body["error"]["reason"], (what, body)


def seg(value: str) -> str:
    """One path segment, every reserved byte percent-encoded (a surrogate as its UTF-8 escape)."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


@pytest.fixture
def fleet(client: Any) -> None:
    for node, caps in {
        "n1": [{"capability": "board", "attrs": {"soc": "imx8mp"}}],
        "n2": [{"capability": "board", "attrs": {"soc": "rk3588"}}],
        "n3": [{"capability": "scope", "attrs": {}}],
        "n4": [{"capability": "agent.reason", "attrs": {}}],
    }.items():
        resp = client.post("/v1/nodes", json={"node_id": node, "capabilities": caps})
        assert resp.status_code == 200, resp.get_json()


# ---------------------------------------------------------------- contracts and adverts


@SETTINGS
@given(doc=hs.contract, path=st.sampled_from(["/v1/runs", "/v1/runs/dry-run"]))
def test_no_contract_is_answered_with_a_5xx(client: Any, fleet: None, doc: Any, path: str) -> None:
    resp = client.post(path, data=encoded(doc), content_type="application/json")
    event(f"{path} {resp.status_code}")
    check_answer(resp, doc)


@SETTINGS
@given(doc=hs.advert)
def test_no_advert_is_answered_with_a_5xx(client: Any, fleet: None, doc: Any) -> None:
    resp = client.post("/v1/nodes", data=encoded(doc), content_type="application/json")
    check_answer(resp, doc)


# ---------------------------------------------------------------- results


@dataclass
class Held:
    """The step a node holds now, claimed for real; replaced when an example settled it."""

    node: str
    instance: str
    capability: str
    run_id: str | None = None
    seq: int = 0
    made: int = 0

    def contract(self) -> dict[str, Any]:
        self.made += 1
        steps = [
            {"id": "build", "uses": "dut", "run": ["make"], "out": ["out.json", "log.txt"]},
            {"id": "test", "uses": "dut", "run": ["make", "check"], "needs": ["build"]},
        ]
        return {
            "run_id": f"{self.node}-run-{self.made}",
            "requires": [{"as": "dut", "capability": self.capability}],
            "steps": steps,
            "success_when": [{"step": "test", "exit_code": 0}],
        }


def hold_a_claimed_step(client: Any, sql: Any, held: Held) -> None:
    if held.run_id is not None:
        row = step_row(sql, held.run_id, held.seq)
        if row["state"] == "CLAIMED":
            return
        client.post(f"/v1/runs/{held.run_id}/cancel")  # frees the node for the next run
    resp = client.post("/v1/runs", json=held.contract())
    assert resp.status_code == 201, resp.get_json()
    step = client.post(
        f"/v1/nodes/{held.node}/claim?wait=0", headers={"X-Enode-Instance": held.instance}
    )
    assert step.status_code == 200, step.get_data()
    held.run_id, held.seq = step.get_json()["run_id"], step.get_json()["seq"]


@pytest.fixture
def result_node(client: Any) -> Held:
    held = Held("rn", "rn-instance", "resultboard")
    caps = [{"capability": held.capability, "attrs": {}}]
    resp = client.post(
        "/v1/nodes", json={"node_id": held.node, "instance": held.instance, "capabilities": caps}
    )
    assert resp.status_code == 200
    return held


elsewhere = st.tuples(hs.name, st.one_of(hs.text, st.sampled_from(["1", "2", "0", "-1"])))


@SETTINGS
@given(
    body=hs.result("rn"),
    target=st.one_of(st.none(), st.none(), st.none(), elsewhere),
)
def test_no_step_result_is_answered_with_a_5xx(
    client: Any, sql: Any, result_node: Held, body: Any, target: Any
) -> None:
    hold_a_claimed_step(client, sql, result_node)
    if target is None:
        path = f"/v1/runs/{result_node.run_id}/steps/{result_node.seq}/result"
    else:
        path = f"/v1/runs/{seg(target[0])}/steps/{seg(target[1])}/result"
    resp = client.post(path, data=encoded(body), content_type="application/json")
    event(f"result {resp.status_code}")
    check_answer(resp, (path, body))


# ---------------------------------------------------------------- answers


def hold_an_open_ask(client: Any, sql: Any, held: Held) -> None:
    if held.run_id is not None:
        if step_row(sql, held.run_id, 1)["state"] == "ASKED":
            return
        client.post(f"/v1/runs/{held.run_id}/cancel")
    held.made += 1
    held.run_id, held.seq = f"ask-run-{held.made}", 1
    doc = {
        "run_id": held.run_id,
        "requires": [{"as": "dut", "capability": held.capability}],
        "steps": [
            {
                "id": "approve",
                "ask": {"prompt": "Looks right?"},
                "out": ["decision"],
                "schema": {"decision": hs.ANSWER_SCHEMA},
            },
            {"id": "flash", "uses": "dut", "run": ["flash-image"]},
        ],
    }
    resp = client.post("/v1/runs", json=doc)
    assert resp.status_code == 201, resp.get_json()
    assert step_row(sql, held.run_id, 1)["state"] == "ASKED"


@pytest.fixture
def ask_node(client: Any) -> Held:
    held = Held("an", "an-instance", "askboard")
    caps = [{"capability": held.capability, "attrs": {}}]
    assert client.post("/v1/nodes", json={"node_id": "an", "capabilities": caps}).status_code == 200
    return held


@SETTINGS
@given(
    body=hs.answer_body,
    principal=st.one_of(st.none(), hs.header_value),
    target=st.one_of(st.none(), st.none(), st.none(), elsewhere),
)
def test_no_answer_is_answered_with_a_5xx(
    client: Any, sql: Any, ask_node: Held, body: Any, principal: Any, target: Any
) -> None:
    hold_an_open_ask(client, sql, ask_node)
    if target is None:
        path = f"/v1/runs/{ask_node.run_id}/steps/1/answer"
    else:
        path = f"/v1/runs/{seg(target[0])}/steps/{seg(target[1])}/answer"
    kind, doc = body
    raw = encoded(doc) if kind == "json" else doc
    headers = {} if principal is None else {"X-Enode-Principal": principal}
    resp = client.post(path, data=raw, content_type="application/json", headers=headers)
    event(f"answer {resp.status_code}")
    check_answer(resp, (path, raw[:200], principal))


# ---------------------------------------------------------------- queries and headers


def query(params: dict[str, str]) -> str:
    return urlencode({k: v.encode("utf-8", "surrogatepass") for k, v in params.items()}, safe="")


@SETTINGS
@given(params=hs.runs_query)
def test_no_run_list_query_is_answered_with_a_5xx(client: Any, fleet: None, params: Any) -> None:
    resp = client.get("/v1/runs?" + query(params))
    check_answer(resp, params)


@SETTINGS
@given(
    route=st.sampled_from(
        [
            "/v1/nodes?{q}",
            "/v1/capabilities?{q}",
            "/v1/asks?{q}",
            "/v1/runs/run-1/steps/1/log?{q}",
            "/v1/nodes/n1/claim?{q}",
        ]
    ),
    params=st.dictionaries(
        st.sampled_from(["from", "wait", "name", "progress", "attempt", "x"]),
        hs.query_value,
        max_size=3,
    ),
)
def test_no_query_on_other_routes_is_answered_with_a_5xx(
    client: Any, fleet: None, route: str, params: Any
) -> None:
    path = route.format(q=query(params))
    method = "POST" if "/claim" in route else "GET"
    resp = client.open(path, method=method)
    check_answer(resp, path)


@SETTINGS
@given(
    headers=st.dictionaries(
        st.sampled_from(["Authorization", "X-Enode-Principal", "X-Enode-Instance"]),
        st.one_of(
            hs.header_value,
            hs.header_value.map(lambda v: "Bearer " + v),
            st.just("Bearer test-token-of-the-mediator-long-enough"),
        ),
        max_size=3,
    ),
    route=st.sampled_from(
        [
            ("GET", "/v1/runs"),
            ("POST", "/v1/nodes/n1/claim?wait=0"),
            ("POST", "/v1/runs/none/cancel"),
            ("GET", "/v1/asks"),
        ]
    ),
)
def test_no_header_is_answered_with_a_5xx(
    client: Any, fleet: None, headers: dict[str, str], route: tuple[str, str]
) -> None:
    resp = client.open(route[1], method=route[0], headers=headers)
    check_answer(resp, (route, headers))
