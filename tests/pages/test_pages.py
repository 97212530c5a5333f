"""The pages for people (docs/pages.md#pages-for-people) over Flask's test client: sessions (the
cookie, expiry, sign-out, a removed or changed token entry), /v1 never taking the cookie, CSRF
refusals that change nothing, the API's roles on every page and form, the 404 page, escaping, the
download routes' headers, and answers through the schema-made forms."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise, claimed
from tests.support.apps import app_on, client_of
from tests.support.contracts import contract, one_step, role
from tests.support.pages import PageUser, csrf_of
from tests.support.status_page import rows
from tests.support.submitter import state_of, step_state, submit
from tests.support.tokens import ENTRIES, SECRETS, sha256_entry


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"tokens": ENTRIES}


def asking(run_id: str, schema: dict[str, Any] | None, **ask: Any) -> dict[str, Any]:
    """A run whose first step asks (with ``schema`` for its answer), then runs on the board."""
    step: dict[str, Any] = {"id": "sign-off", "ask": {"prompt": "Ship it?", **ask}, "out": ["d"]}
    if schema is not None:
        step["schema"] = {"d": schema}
    return contract(
        run_id,
        role("dut"),
        steps=[step, {"id": "boot", "uses": "dut", "run": ["boot"], "needs": ["sign-off"]}],
    )


def open_ask(app: Any, run_id: str = "r1", schema: dict[str, Any] | None = None) -> Any:
    api = client_of(app)
    advertise(api, "board-1", cap("board"))
    submit(api, asking(run_id, schema), 201)
    return api


def busy_board(app: Any) -> Any:
    """One board, held by the run ``holder``: what is submitted next waits in the queue."""
    api = client_of(app)
    advertise(api, "board-1", cap("board"))
    submit(api, one_step("holder"), 201)
    return api


def session_rows(sql: Any) -> list[tuple[Any, ...]]:
    return sql.execute("SELECT id_digest, token_name, principal FROM ui_sessions").fetchall()


# ---------------------------------------------------------------- sessions


def test_sign_in_sets_an_httponly_lax_secure_cookie_holding_only_a_session_id(app, sql) -> None:
    user = PageUser(app)
    resp = user.sign_in(SECRETS["reader"], next_path="/runs")
    assert resp.status_code == 303
    assert resp.headers["Location"] == "/runs"
    cookie = next(
        c for c in resp.headers.getlist("Set-Cookie") if c.startswith("mediator_session=")
    )
    parts = [p.strip() for p in cookie.split(";")]
    assert "HttpOnly" in parts and "SameSite=Lax" in parts and "Secure" in parts
    session_id = parts[0].split("=", 1)[1]
    assert len(session_id) >= 43 and SECRETS["reader"] not in cookie
    [(digest, name, principal)] = session_rows(sql)
    assert (name, principal) == ("reader", None) and digest != session_id
    assert "Signed in as" in user.page("/runs")


def test_sign_in_goes_on_only_to_a_path_of_this_site(app) -> None:
    for given, went in (("/asks", "/asks"), ("//evil.test/x", "/"), ("https://evil.test", "/")):
        resp = PageUser(app).sign_in(SECRETS["reader"], next_path=given)
        assert resp.status_code == 303 and resp.headers["Location"] == went, given


def test_ui_insecure_cookie_leaves_secure_out(db_url, tmp_path) -> None:
    with app_on(db_url, tmp_path / "r", tokens=ENTRIES, **{"ui.insecure_cookie": True}) as app:
        resp = PageUser(app).sign_in(SECRETS["reader"])
    cookie = next(
        c for c in resp.headers.getlist("Set-Cookie") if c.startswith("mediator_session=")
    )
    assert "Secure" not in [p.strip() for p in cookie.split(";")]


def test_a_wrong_token_is_refused_and_makes_no_session(app, sql) -> None:
    resp = PageUser(app).sign_in("not-a-token")
    assert resp.status_code == 401
    assert "that is not a token of this Mediator" in resp.text
    assert session_rows(sql) == []


def test_wrong_tokens_at_the_sign_in_count_toward_the_addresss_limit(db_url, tmp_path, sql) -> None:
    """Failed sign-ins are failed authentications; past the limit, 429
    (docs/security.md#tokens-and-authentication)."""
    keys = {"auth.max_failures_per_minute": 2, "auth.limit_loopback": True}
    with app_on(db_url, tmp_path / "r", tokens=ENTRIES, **keys) as app:
        user = PageUser(app)
        assert [user.sign_in(f"wrong-{i}").status_code for i in range(3)] == [401, 401, 429]
        assert user.sign_in(SECRETS["reader"]).status_code == 429
    assert session_rows(sql) == []


def test_pages_send_a_browser_without_a_session_to_the_sign_in(app) -> None:
    for path in ("/runs", "/asks", "/nodes", "/runs/r1"):
        resp = PageUser(app).get(path)
        assert resp.status_code == 303, path
        assert resp.headers["Location"].startswith("/signin?next=")


def test_sign_out_ends_the_session_and_its_cookie_no_longer_opens_a_page(app, sql) -> None:
    user = PageUser(app).signed_in(SECRETS["reader"])
    cookie = user.cookie("mediator_session")
    assert user.sign_out().status_code == 303
    assert session_rows(sql) == []
    replay = app.test_client()
    replay.set_cookie("mediator_session", cookie)
    assert replay.get("/runs").status_code == 303


def test_the_pages_script_and_sheet_leave_the_session_alone(app, sql) -> None:
    """The static files answer without reading the session: they never drop its cookie."""
    user = PageUser(app).signed_in(SECRETS["reader"])
    for path in ("/static/pages.js", "/static/pages.css"):
        resp = user.get(path)
        assert resp.status_code == 200
        assert "mediator_session" not in " ".join(resp.headers.getlist("Set-Cookie")), path
    assert "Signed in as" in user.page("/runs")
    assert len(session_rows(sql)) == 1


def test_an_expired_session_opens_no_page(app, sql) -> None:
    user = PageUser(app).signed_in(SECRETS["reader"])
    sql.execute("UPDATE ui_sessions SET expires_at = now() - interval '1 second'")
    assert user.get("/runs").status_code == 303


def test_the_reaper_forgets_expired_sessions_and_keeps_live_ones(app, ctx, sql) -> None:
    PageUser(app).signed_in(SECRETS["reader"])
    PageUser(app).signed_in(SECRETS["operator"])
    sql.execute(
        "UPDATE ui_sessions SET expires_at = now() - interval '1 second' WHERE token_name = 'reader'"
    )
    reap_pass(ctx)
    assert [name for _, name, _ in session_rows(sql)] == ["op"]


def test_a_session_lasts_ui_session_hours(db_url, tmp_path, sql) -> None:
    with app_on(db_url, tmp_path / "r", tokens=ENTRIES, **{"ui.session_hours": 2}) as app:
        PageUser(app).signed_in(SECRETS["reader"])
    [(hours,)] = sql.execute(
        "SELECT round(extract(epoch FROM expires_at - created_at) / 3600) FROM ui_sessions"
    ).fetchall()
    assert hours == 2


def test_a_removed_or_changed_token_entry_ends_the_session(db_url, tmp_path, sql) -> None:
    reader = sha256_entry("reader", SECRETS["reader"], "reader")
    with app_on(db_url, tmp_path / "r", tokens=[reader]) as app:
        user = PageUser(app).signed_in(SECRETS["reader"])
        cookie = user.cookie("mediator_session")
    changed = sha256_entry("reader", SECRETS["reader"], "reader", "answerer")
    for tokens in ([changed], [sha256_entry("other", "s3cret-other", "reader")]):
        with app_on(db_url, tmp_path / "r", tokens=tokens) as app:
            browser = app.test_client()
            browser.set_cookie("mediator_session", cookie)
            assert browser.get("/runs").status_code == 303
        assert session_rows(sql) == []  # ended, not only refused
        with app_on(db_url, tmp_path / "r", tokens=[reader]) as app:
            user = PageUser(app).signed_in(SECRETS["reader"])
            cookie = user.cookie("mediator_session")


def test_v1_never_takes_the_cookie(app) -> None:
    user = PageUser(app).signed_in(SECRETS["operator"])
    resp = user.get("/v1/runs")
    assert resp.status_code == 401
    assert resp.get_json() == {"error": {"code": 401, "reason": "missing or invalid token"}}


def test_a_principal_given_at_sign_in_is_recorded_as_self_declared(app) -> None:
    api = open_ask(app)
    user = PageUser(app).signed_in(SECRETS["answerer"], principal="bo@lab.test")
    resp = user.send_form("/asks", "/asks/r1/1", {"answer": '"yes"'})
    assert resp.status_code == 303
    [entry] = [e for e in api.get("/v1/runs/r1/ledger").get_json()["entries"] if e["name"] == "d"]
    assert entry["by"] == "bo@lab.test" and entry["by_self_declared"] is True
    assert entry["token"] == "ans"


def test_a_token_with_its_own_principal_refuses_another_at_sign_in(app, sql) -> None:
    resp = PageUser(app).sign_in(SECRETS["alice"], principal="mallory@lab.test")
    assert resp.status_code == 403
    assert session_rows(sql) == []


# ---------------------------------------------------------------- CSRF


def test_a_sign_in_without_the_csrf_token_is_refused(app, sql) -> None:
    user = PageUser(app)
    user.page("/signin")
    resp = user.post("/signin", {"token": SECRETS["operator"]})
    assert resp.status_code == 400
    assert "CSRF token is missing" in resp.text
    assert session_rows(sql) == []


def test_a_forged_cancel_without_the_csrf_token_changes_nothing(app) -> None:
    api = busy_board(app)
    submit(api, one_step("waits"), 202)
    user = PageUser(app).signed_in(SECRETS["operator"])
    resp = user.post("/runs/waits/cancel", {"cancel": "1"})
    assert resp.status_code == 400
    assert state_of(api, "waits") == "QUEUED"
    other = PageUser(app).signed_in(SECRETS["operator"])  # another session's token
    resp = user.post("/runs/waits/cancel", {"csrf_token": csrf_of(other.page("/runs"))})
    assert resp.status_code == 400
    assert state_of(api, "waits") == "QUEUED"


def test_a_forged_answer_without_the_csrf_token_changes_nothing(app) -> None:
    api = open_ask(app)
    user = PageUser(app).signed_in(SECRETS["operator"])
    assert user.post("/asks/r1/1", {"answer": '"yes"'}).status_code == 400
    assert step_state(api, "r1", 1) == "ASKED"


# ---------------------------------------------------------------- roles


def test_a_reader_sees_the_asks_and_is_refused_an_answer(app) -> None:
    api = open_ask(app)
    user = PageUser(app).signed_in(SECRETS["reader"])
    html = user.page("/asks")
    assert 'data-ask="r1/1"' in html and "lacks the role answerer" in html
    resp = user.send_form("/asks", "/asks/r1/1", {"answer": '"yes"'})
    assert resp.status_code == 403
    assert "token reader lacks the role: answerer or operator" in resp.text
    assert step_state(api, "r1", 1) == "ASKED"


def test_a_node_token_reads_runs_and_nodes_but_not_the_asks(app) -> None:
    open_ask(app)
    user = PageUser(app).signed_in(SECRETS["node-n1"])
    user.page("/runs")
    user.page("/nodes")
    user.page("/runs/r1")
    resp = user.get("/asks")
    assert resp.status_code == 403
    assert "lacks the role: answerer or reader or operator" in resp.text


def test_cancel_is_shown_to_an_operator_and_to_the_submitting_token_only(app) -> None:
    """The cancel's own rule (docs/security.md#authorisation): an operator cancels any run, a
    submitter only the runs submitted with its own token; Cancel is shown to exactly those
    (docs/pages.md#a-run-runsrun_id), never as a button that answers 403."""
    busy_board(app)  # "holder", submitted with the legacy token
    sub = client_of(app)
    sub.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {SECRETS['submitter']}"
    submit(sub, one_step("mine"), 202)
    reader = PageUser(app).signed_in(SECRETS["reader"])
    assert 'id="cancel-form"' not in reader.page("/runs/mine")
    other = PageUser(app).signed_in(SECRETS["submitter-b"])
    assert 'id="cancel-form"' not in other.page("/runs/mine")
    owner = PageUser(app).signed_in(SECRETS["submitter"])
    assert 'id="cancel-form"' not in owner.page("/runs/holder")
    assert 'id="cancel-form"' in owner.page("/runs/mine")
    operator = PageUser(app).signed_in(SECRETS["operator"])
    assert 'id="cancel-form"' in operator.page("/runs/mine")
    assert 'id="cancel-form"' in operator.page("/runs/holder")

    # A form sent all the same (from the page of a run it may cancel) is still refused.
    resp = other.post("/runs/mine/cancel", {"csrf_token": csrf_of(other.page("/runs"))})
    assert resp.status_code == 403
    assert "a submitter may cancel only its own runs" in resp.text
    assert state_of(client_of(app), "mine") == "QUEUED"
    assert owner.send_form("/runs/mine", "/runs/mine/cancel", {}).status_code == 303
    assert state_of(client_of(app), "mine") == "FAILED"
    assert 'id="cancel-form"' not in operator.page("/runs/mine")  # finished: nothing to cancel


# ---------------------------------------------------------------- pages


def test_an_unknown_run_is_a_404_page(app) -> None:
    user = PageUser(app).signed_in(SECRETS["reader"])
    for path in ("/runs/no-such-run", "/runs/" + "x" * 300, "/runs/bad%00id"):
        resp = user.get(path)
        assert resp.status_code == 404, path
        assert resp.headers["Content-Type"].startswith("text/html")
        assert "no such run" in resp.text


def test_pages_carry_a_csp_that_forbids_framing(app) -> None:
    user = PageUser(app).signed_in(SECRETS["reader"])
    for path in ("/", "/runs", "/asks", "/nodes", "/signin"):
        resp = user.get(path)
        assert resp.status_code == 200, path
        assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"]
        assert resp.headers["X-Content-Type-Options"] == "nosniff"


HOSTILE = '<script>alert("x")</script>'


def test_every_page_escapes_what_users_wrote(app) -> None:
    api = client_of(app)
    advertise(api, "board-1", cap("board", soc=HOSTILE), label=HOSTILE)
    doc = asking(
        "r1", {"type": "object", "properties": {"v": {"type": "string", "title": HOSTILE}}}
    )
    doc["steps"][0]["ask"]["prompt"] = HOSTILE
    resp = api.post("/v1/runs", json=doc, headers={"X-Enode-Principal": HOSTILE})
    assert resp.status_code == 201
    user = PageUser(app).signed_in(SECRETS["operator"])
    for path in ("/runs", "/runs/r1", "/asks", "/nodes", "/"):
        html = user.page(path)
        assert HOSTILE not in html and "<script>alert" not in html, path
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html, path


def test_user_text_is_isolated_in_bdi_on_every_page(app) -> None:
    """A principal, a prompt or a label holding U+202E cannot turn the page
    (docs/pages.md#safety)."""
    flipped = "qa\u202eexe.txt"
    api = client_of(app)
    advertise(api, "board-1", cap("board"), label=flipped)
    doc = asking("r1", None)
    doc["steps"][0]["ask"]["prompt"] = flipped
    assert api.post("/v1/runs", json=doc, headers={"X-Enode-Principal": flipped}).status_code == 201
    user = PageUser(app).signed_in(SECRETS["operator"], principal=flipped)
    for path in ("/runs", "/runs/r1", "/asks", "/nodes"):
        html = user.page(path)
        shown = html.count(flipped)
        # adverts get U+FFFD (docs/security.md#input-and-load)
        assert shown >= (1 if path == "/nodes" else 2), path
        assert html.count(f"<bdi>{flipped}</bdi>") == shown, path


def test_the_runs_page_pages_with_the_apis_cursor_and_filters(app) -> None:
    api = busy_board(app)
    for i in range(3):
        submit(api, one_step(f"q{i}"), 202)
    user = PageUser(app).signed_in(SECRETS["reader"])
    html = user.page("/runs?limit=2&state=QUEUED")
    assert list(rows(html, "run")) == ["q2", "q1"]
    cursor = api.get("/v1/runs?limit=2&state=QUEUED").get_json()["next"]
    assert "before=" in html
    assert list(rows(user.page(f"/runs?limit=2&state=QUEUED&before={cursor}"), "run")) == ["q0"]
    resp = user.get("/runs?limit=0")
    assert resp.status_code == 400 and "limit must be a positive integer" in resp.text


def test_a_queued_run_explains_its_wait(app) -> None:
    api = client_of(app)
    advertise(api, "board-1", cap("board"))
    submit(api, one_step("first"), 201)
    submit(api, one_step("second"), 202)
    html = PageUser(app).signed_in(SECRETS["reader"]).page("/runs/second")
    assert "Position 1 (0 ahead)" in html
    assert "1 live, 1 busy; held by" in html and "first" in html


def test_the_nodes_page_shows_tiles_and_capability_counts(app) -> None:
    api = client_of(app)
    advertise(api, "board-1", cap("board"))
    advertise(api, "board-2", cap("board"))
    advertise(api, "scope-1", cap("scope"), policy={"drain": "graceful"})
    submit(api, one_step("r1"), 201)
    html = PageUser(app).signed_in(SECRETS["reader"]).page("/nodes")
    tiles = {n: t for n, t in _tiles(html)}
    assert set(tiles.values()) == {"leased", "free", "draining"}
    assert tiles["scope-1"] == "draining"
    caps = rows(html.replace("data-capability", "data-node"), "capability")
    assert caps["board"].startswith("board 2") and caps["scope"].startswith("scope 1")


def _tiles(html: str) -> list[tuple[str, str]]:
    import re

    return re.findall(r'data-node="([^"]+)" data-tile="([^"]+)"', html)


# ---------------------------------------------------------------- downloads


def test_logs_artifacts_and_the_record_download_as_sandboxed_attachments(app) -> None:
    api = open_ask(app)
    user = PageUser(app).signed_in(SECRETS["operator"])
    assert user.send_form("/asks", "/asks/r1/1", {"answer": '"<html>yes"'}).status_code == 303
    step = claimed(api, "board-1")
    api.put(f"/v1/runs/r1/steps/{step['seq']}/log", data=b"<script>boot</script>\n")
    log = user.get(f"/runs/r1/steps/{step['seq']}/log?from=8")
    assert log.status_code == 200 and log.data == b"boot</script>\n"
    assert log.headers["X-Enode-Log-Bytes"] == "22"
    assert log.headers["Content-Type"].startswith("text/plain")
    art = user.get("/runs/r1/artifacts/d")
    assert art.data == b'"<html>yes"'
    api.post(f"/v1/runs/r1/steps/{step['seq']}/result", json={"node": "board-1", "exit_code": 0})
    record = user.get("/runs/r1/record")
    assert record.status_code == 200 and record.data[257:262] == b"ustar"
    for resp in (log, art, record):
        assert resp.headers["Content-Disposition"].startswith("attachment; filename=")
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["Content-Security-Policy"] == "sandbox"


# ---------------------------------------------------------------- answer forms


def test_an_enum_is_one_submit_button_per_value_and_answers_with_it(app) -> None:
    verdict = {"enum": ["ship", "hold", 3]}
    api = open_ask(app, schema={"type": "object", "properties": {"verdict": verdict}})
    user = PageUser(app).signed_in(SECRETS["operator"])
    html = user.page("/asks")
    assert 'data-ask="r1/1"' in html
    for value in ("ship", "hold", "3"):
        assert f'<button type="submit" name="verdict" value="{value}">' in html
    assert 'class="answer"' not in html  # the values are the form's buttons
    resp = user.send_form("/asks", "/asks/r1/1", {"verdict": "3"})
    assert resp.status_code == 303 and resp.headers["Location"] == "/runs/r1?answered=1"
    assert json.loads(api.get("/v1/runs/r1/blob/d").data) == {"verdict": 3}
    assert step_state(api, "r1", 1) == "DONE"


OBJECT = {
    "type": "object",
    "required": ["ok", "count"],
    "properties": {
        "ok": {"type": "boolean", "title": "Board boots"},
        "count": {"type": "integer", "description": "boards seen"},
        "ratio": {"type": "number"},
        "note": {"type": "string"},
        "tags": {"type": ["string", "null"]},
    },
}


def test_an_object_is_one_labelled_field_per_property(app) -> None:
    open_ask(app, schema=OBJECT)
    html = PageUser(app).signed_in(SECRETS["operator"]).page("/asks")
    assert 'type="checkbox" id="f-r1-1-ok" name="ok" value="true"' in html
    assert '<label for="f-r1-1-ok">' in html and "Board boots" in html
    assert 'type="number" id="f-r1-1-count" name="count" step="1"' in html
    assert "boards seen" in html
    assert 'type="number" id="f-r1-1-ratio" name="ratio" step="any"' in html
    assert 'type="text" id="f-r1-1-note" name="note"' in html
    assert '<textarea id="f-r1-1-tags" name="tags"' in html
    assert '<label for="f-r1-1-tags"><bdi>tags</bdi>' in html


def test_an_unchecked_box_answers_false_and_empty_optional_fields_are_left_out(app) -> None:
    api = open_ask(app, schema=OBJECT)
    user = PageUser(app).signed_in(SECRETS["operator"])
    form = {"count": "2", "ratio": "", "note": "", "tags": "null"}
    assert user.send_form("/asks", "/asks/r1/1", form).status_code == 303
    assert json.loads(api.get("/v1/runs/r1/blob/d").data) == {
        "ok": False,
        "count": 2,
        "tags": None,
    }


def test_a_value_the_schema_refuses_keeps_the_input_and_names_the_field(app) -> None:
    api = open_ask(app, schema=OBJECT)
    user = PageUser(app).signed_in(SECRETS["operator"])
    form = {"ok": "true", "count": "", "ratio": "2.5", "note": "kept", "tags": '"x"'}
    resp = user.send_form("/asks", "/asks/r1/1", form)
    assert resp.status_code == 422
    assert '<p class="error field-error" data-error-for="count">' in resp.text
    assert "schema violation: $: &#39;count&#39; is a required property" in resp.text
    assert 'name="ratio" step="any" value="2.5"' in resp.text
    assert 'name="note" value="kept"' in resp.text
    assert 'name="ok" value="true" checked' in resp.text
    assert step_state(api, "r1", 1) == "ASKED"


def test_a_value_the_form_cannot_read_keeps_the_input_and_names_the_field(app) -> None:
    api = open_ask(app, schema=OBJECT)
    user = PageUser(app).signed_in(SECRETS["operator"])
    resp = user.send_form("/asks", "/asks/r1/1", {"count": "many", "tags": "[oops"})
    assert resp.status_code == 400
    assert 'data-error-for="count"><bdi>not a whole number' in resp.text
    assert 'data-error-for="tags"><bdi>not JSON' in resp.text
    assert 'value="many"' in resp.text and "[oops</textarea>" in resp.text
    assert step_state(api, "r1", 1) == "ASKED"


def test_an_answer_to_an_ask_no_longer_open_is_a_409_page(app) -> None:
    open_ask(app)
    user = PageUser(app).signed_in(SECRETS["operator"])
    assert user.send_form("/asks", "/asks/r1/1", {"answer": "1"}).status_code == 303
    resp = user.send_form("/runs", "/asks/r1/1", {"answer": "1"})
    assert resp.status_code == 409 and "step is not awaiting an answer" in resp.text


def test_the_asks_a_principal_may_answer_come_first(app) -> None:
    api = client_of(app)
    advertise(api, "board-1", cap("board"))
    advertise(api, "board-2", cap("board"))
    submit(api, asking("theirs", None, answerers=["someone@lab.test"]), 201)
    submit(api, asking("mine", None, answerers=["alice@example.com"]), 201)
    html = PageUser(app).signed_in(SECRETS["alice"]).page("/asks")
    assert html.index('data-ask="mine/1"') < html.index('data-ask="theirs/1"')
