"""An ask's answer through the page stores what the answerer gave, never a field the form sends
for itself (its CSRF token), even for an ask whose schema names a property like that field
(stored before contracts were refused such names)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import client_of
from tests.support.contracts import contract, role
from tests.support.pages import PageUser, csrf_of
from tests.support.submitter import submit
from tests.support.tokens import ENTRIES, SECRETS


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"tokens": ENTRIES}


def test_an_ask_with_a_csrf_token_property_answered_on_the_page_never_stores_the_csrf_token(
    app, sql
) -> None:
    api = client_of(app)
    advertise(api, "board-1", cap("board"))
    schema = {"type": "object", "properties": {"note": {"type": "string"}}}
    ask = {"id": "q", "ask": {"prompt": "Ship it?"}, "out": ["d"], "schema": {"d": schema}}
    submit(api, contract("r1", role("dut"), steps=[ask]), 201)
    # The schema as a contract of before the refusal stored it.
    props = {"csrf_token": {"type": "string"}, "note": {"type": "string"}}
    sql.execute(
        "update steps set spec = jsonb_set(spec, '{schema,d,properties}', %s::jsonb)"
        " where run_id = 'r1' and seq = 1",
        (json.dumps(props),),
    )
    user = PageUser(app).signed_in(SECRETS["operator"])
    page = user.page("/asks")
    token = csrf_of(page)

    answer = {"csrf_token": "typed", "note": "fine"}
    resp = user.post("/asks/r1/1", {"csrf_token": token, "answer": json.dumps(answer)})

    assert resp.status_code == 303, resp.text[:500]
    stored = api.get("/v1/runs/r1/blob/d").data
    assert json.loads(stored) == answer
    assert token.encode() not in stored
