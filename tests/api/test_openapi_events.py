"""The OpenAPI document (docs/api.md#get-v1openapijson) and the audit trail of a run
(docs/api.md#get-v1runsrun_idevents--a-runs-audit-trail)."""

from __future__ import annotations

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import contract
from tests.support.submitter import submit

DOCUMENTED = {
    ("post", "/v1/nodes"),
    ("post", "/v1/nodes/{node_id}/claim"),
    ("post", "/v1/runs/{run_id}/steps/{seq}/result"),
    ("post", "/v1/runs"),
    ("post", "/v1/runs/dry-run"),
    ("get", "/v1/runs/{run_id}"),
    ("get", "/v1/runs"),
    ("get", "/v1/nodes"),
    ("get", "/v1/capabilities"),
    ("get", "/v1/asks"),
    ("post", "/v1/runs/{run_id}/steps/{seq}/answer"),
    ("post", "/v1/runs/{run_id}/cancel"),
    ("put", "/v1/runs/{run_id}/steps/{seq}/log"),
    ("put", "/v1/runs/{run_id}/steps/{seq}/blob/{name}"),
    ("get", "/v1/runs/{run_id}/blob/{name}"),
    ("get", "/v1/runs/{run_id}/steps/{seq}/log"),
    ("get", "/v1/runs/{run_id}/ledger"),
    ("get", "/v1/runs/{run_id}/record"),
    ("get", "/v1/runs/{run_id}/events"),
}


def test_the_openapi_document_needs_no_token_and_documents_every_v1_route(app):
    resp = app.test_client().get("/v1/openapi.json")

    assert resp.status_code == 200
    doc = resp.get_json()
    assert doc["openapi"].startswith("3.")
    found = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert DOCUMENTED <= found
    submit_op = doc["paths"]["/v1/runs"]["post"]
    assert {"201", "202", "200", "400", "422"} <= set(submit_op["responses"])
    assert "Contract" in doc["components"]["schemas"]


def test_the_events_of_a_run_tell_its_story_from_submit_to_cancel(client):
    advertise(client, "n1", cap("board"))
    submit(client, contract("first"), 201)
    submit(client, contract("second"), 202)
    client.post("/v1/runs/first/cancel", headers={"X-Enode-Principal": "ops@example.com"})
    client.post("/v1/runs/second/cancel", headers={"X-Enode-Principal": "qa@example.com"})

    first = client.get("/v1/runs/first/events").get_json()["events"]
    second = client.get("/v1/runs/second/events").get_json()["events"]

    assert [(e["from"], e["to"]) for e in first] == [(None, "RUNNING"), ("RUNNING", "FAILED")]
    assert first[1]["by"] == "ops@example.com" and "ops@example.com" in first[1]["cause"]
    assert [(e["from"], e["to"]) for e in second] == [
        (None, "QUEUED"),
        ("QUEUED", "RUNNING"),
        ("RUNNING", "FAILED"),
    ]
    assert second[1]["cause"].startswith("promoted")
    assert all(e["at"].endswith("Z") for e in first + second)


def test_the_events_of_an_unknown_run_are_404(client):
    resp = client.get("/v1/runs/nope/events")
    assert resp.status_code == 404 and "nope" in resp.get_json()["error"]["reason"]
