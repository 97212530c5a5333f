"""Bounded input (docs/security.md#input-and-load, docs/contract.md#limits,
docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl,
docs/api.md#put-v1runsrun_idstepsseqblobname--upload-an-artifact): an exit code is taken up to 64
bits and every other integer the API takes is bounded before it reaches a 32-bit column; no query
parameter, header, path segment or body brings the database a NUL or a lone surrogate; no name that
becomes a file of the Record holds a control character, so a sealed Record passes ``sha256sum -c``.
Each is a 4xx naming the field, never a 500, never a partial write."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from alembic import command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config import to_libpq_url
from app.migrate import alembic_config
from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done, report
from tests.support.contracts import contract, contract_naming, role
from tests.support.rows import find_run, one, scalar, step_row
from tests.support.scenes import placed_on_n1
from tests.support.submitter import submit
from tests.support.wire import error_of

one_app_per_module = True

INT4_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


# ------------------------------------------------------------------ exit codes


@pytest.mark.parametrize(
    "code",
    [3221225477, INT4_MAX + 1, INT64_MAX, INT64_MIN, -1073741819],
    ids=["windows-access-violation", "int4-max+1", "int64-max", "int64-min", "negative-ntstatus"],
)
def test_an_exit_code_any_operating_system_reports_is_taken_stored_and_shown(client, sql, code):
    placed_on_n1(client)
    step = claimed(client, "n1")

    reply = done(client, "r1", step["seq"], "n1", exit_code=code)

    assert reply["run_state"] == "SUCCEEDED"
    assert step_row(sql, "r1", 1, "exit_code")["exit_code"] == code
    view = client.get("/v1/runs/r1").get_json()
    assert view["steps"][0]["exit_code"] == code


def test_a_sealed_record_keeps_an_exit_code_beyond_32_bits(client, ctx):
    placed_on_n1(client)
    step = claimed(client, "n1")
    done(client, "r1", step["seq"], "n1", exit_code=3221225477)

    doc = (ctx.records.path("r1") / "steps" / "01-work.json").read_text()

    assert '"exit_code": 3221225477' in doc or '"exit_code":3221225477' in doc


@pytest.mark.parametrize("code", [INT64_MAX + 1, INT64_MIN - 1, 10**30, -(10**30)])
def test_an_exit_code_beyond_64_bits_is_a_400_naming_exit_code_and_changes_nothing(
    client, sql, code
):
    placed_on_n1(client)
    step = claimed(client, "n1")

    resp = report(client, "r1", step["seq"], "n1", exit_code=code)

    assert resp.status_code == 400
    assert error_of(resp) == f"exit_code: must be a signed 64-bit integer, got {code}"
    row = step_row(sql, "r1", 1, "state, exit_code")
    assert (row["state"], row["exit_code"]) == ("CLAIMED", None)


def test_the_exit_code_column_is_bigint_and_the_migration_keeps_stored_codes(fresh_db_url):
    cfg = alembic_config(fresh_db_url)
    command.downgrade(cfg, "0002")
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, state, contract, requires, requires_key)"
            " VALUES ('old', 'RUNNING', '{}', '[]', 'k')"
        )
        conn.execute(
            "INSERT INTO steps (run_id, seq, step_id, kind, spec, exit_code)"
            " VALUES ('old', 1, 's', 'run', '{}', -2147483648)"
        )
    command.upgrade(cfg, "head")
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        kind = scalar(
            conn,
            "SELECT data_type FROM information_schema.columns"
            " WHERE table_name = 'steps' AND column_name = 'exit_code'",
        )
        kept = scalar(conn, "SELECT exit_code FROM steps WHERE run_id = 'old'")
        conn.execute(
            "INSERT INTO steps (run_id, seq, step_id, kind, spec, exit_code)"
            " VALUES ('old', 2, 't', 'run', '{}', %s)",
            (INT64_MAX,),
        )
    assert (kind, kept) == ("bigint", -2147483648)


# ------------------------------------------------------------------ every other integer

_RUN = {"id": "s", "uses": "dut", "run": ["x"], "out": ["r.json"]}
_LOOP = {"id": "t", "uses": "dut", "run": ["y"], "loop": {"back_to": "s", "max": 2, "until": {}}}


def _with(path: str, value: Any) -> dict[str, Any]:
    """A valid contract with ``value`` at one integer field."""
    steps: list[dict[str, Any]] = [dict(_RUN)]
    top: dict[str, Any] = {}
    requires = [role("dut")]
    if path == "requires[0].count":
        requires = [{**role("dut"), "count": value}]
    elif path == "steps[1].loop.max":
        steps.append({**_LOOP, "loop": {"back_to": "s", "max": value, "until": {"exit_code": 0}}})
    elif path == "steps[1].loop.until.exit_code":
        steps.append({**_LOOP, "loop": {"back_to": "s", "max": 2, "until": {"exit_code": value}}})
    elif path == "steps[0].max_attempts":
        steps = [
            {**_RUN, "validate_with": "v", "max_attempts": value},
            {"id": "v", "uses": "dut", "run": ["v"]},
        ]
    elif path.startswith("steps[0].agent."):
        steps = [{"id": "s", "uses": "dut", "agent": {path.rsplit(".", 1)[1]: value}}]
    elif path == "success_when[0].exit_code":
        top["success_when"] = [{"step": "s", "exit_code": value}]
    elif path == "success_when[0].min_count":
        top["success_when"] = [{"fleet_has": {"capability": "board"}, "min_count": value}]
    elif path == "work.patchset":
        top["work"] = {"id": {"system": "g", "change_id": "1"}, "patchset": value}
    else:  # pragma: no cover - a mistake in the table below
        raise AssertionError(path)
    return contract("r1", *requires, steps=steps, **top)


INTEGER_FIELDS = [
    "requires[0].count",
    "steps[1].loop.max",
    "steps[0].max_attempts",
    "steps[0].agent.max_turns",
    "steps[0].agent.max_tokens",
    "success_when[0].min_count",
    "work.patchset",
]
# An exit code a contract expects is any one a result may report: a signed 64-bit integer.
EXIT_CODE_FIELDS = ["steps[1].loop.until.exit_code", "success_when[0].exit_code"]


@pytest.mark.parametrize("value", [INT4_MAX + 1, 2**63, 10**40], ids=["int4+1", "int8+1", "huge"])
@pytest.mark.parametrize("path", INTEGER_FIELDS)
def test_a_contract_integer_past_its_bound_is_a_400_naming_the_field_and_stores_nothing(
    client, sql, path, value
):
    advertise(client, "n1", cap("board"))

    resp = submit(client, _with(path, value))

    assert resp.status_code == 400, resp.get_json()
    assert error_of(resp).startswith(path), error_of(resp)
    assert find_run(sql, "r1") is None


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**40], ids=["int8+1", "int8-1", "huge"])
@pytest.mark.parametrize("path", EXIT_CODE_FIELDS)
def test_a_contract_exit_code_beyond_64_bits_is_a_400_naming_the_field(client, sql, path, value):
    advertise(client, "n1", cap("board"))

    resp = submit(client, _with(path, value))

    assert resp.status_code == 400, resp.get_json()
    assert error_of(resp).startswith(path), error_of(resp)
    assert find_run(sql, "r1") is None


@pytest.mark.parametrize("path", EXIT_CODE_FIELDS)
def test_a_contract_may_expect_an_exit_code_beyond_32_bits(client, path):
    advertise(client, "n1", cap("board"))

    resp = submit(client, _with(path, 3221225477))

    assert resp.status_code == 201, resp.get_json()


def test_a_condition_on_a_windows_exit_code_is_met_by_that_code(client):
    advertise(client, "n1", cap("board"))
    doc = contract(
        "r1",
        role("dut"),
        steps=[{"id": "work", "uses": "dut", "run": ["x"]}],
        success_when=[{"step": "work", "exit_code": 3221225477}],
    )
    submit(client, doc, 201)
    step = claimed(client, "n1")

    reply = done(client, "r1", step["seq"], "n1", exit_code=3221225477)

    assert reply["run_state"] == "SUCCEEDED"


@pytest.mark.parametrize(
    ("where", "timeout"),
    [("queue.timeout", "596524h"), ("steps[0].ask.timeout.after", "99999999999999s")],
)
def test_a_timeout_whose_seconds_pass_a_32_bit_column_is_a_400_naming_it(
    client, sql, where, timeout
):
    advertise(client, "n1", cap("board"))
    if where == "queue.timeout":
        doc = contract("r1", role("dut"), queue={"timeout": timeout})
    else:
        ask = {"id": "q", "ask": {"prompt": "ok?", "timeout": {"after": timeout}}, "out": ["d"]}
        doc = contract("r1", role("dut"), steps=[ask, {"id": "w", "uses": "dut", "run": ["x"]}])

    resp = submit(client, doc)

    assert resp.status_code == 400 and error_of(resp).startswith(where), resp.get_json()
    assert find_run(sql, "r1") is None


def test_the_longest_timeouts_that_fit_are_taken(client, sql):
    advertise(client, "n1", cap("board"))
    ask = {"id": "q", "ask": {"prompt": "ok?", "timeout": {"after": "596523h14m7s"}}, "out": ["d"]}
    steps = [ask, {"id": "w", "uses": "dut", "run": ["x"]}]
    doc = contract("r1", role("dut"), steps=steps, queue={"timeout": "596523h14m7s"})

    resp = submit(client, doc, 201)

    assert resp.get_json()["state"] == "RUNNING"
    assert one(sql, "select queue_timeout_seconds from runs")["queue_timeout_seconds"] == INT4_MAX
    assert scalar(sql, "select ask_deadline > now() + interval '68 years' from steps where seq = 1")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("/v1/runs?limit=9999999999999", "limit must be a positive integer, got '9999999999999'"),
        ("/v1/runs?limit=0", "limit must be a positive integer, got '0'"),
        ("/v1/runs/r1/steps/9999999999/log", "seq must be a positive integer, got '9999999999'"),
        ("/v1/runs/r1/steps/1/log?from=9999999999999999999", "from must be a byte offset, got "),
    ],
)
def test_a_query_or_path_integer_past_its_bound_is_a_400_naming_it(client, url, reason):
    placed_on_n1(client)

    resp = client.get(url)

    assert resp.status_code == 400 and error_of(resp).startswith(reason), resp.get_json()


@pytest.mark.parametrize(
    ("method", "url", "reason"),
    [
        ("GET", "/v1/runs?since=yesterday", "since must be an RFC 3339 time, got 'yesterday'"),
        (
            "GET",
            "/v1/runs?before=2026-12-05T00:00:00Z",
            "before must be the cursor <created_at>,<run_id>, got '2026-12-05T00:00:00Z'",
        ),
        ("GET", "/v1/runs?work=a%00b", "work must not contain a NUL character, got 'a\\x00b'"),
        ("POST", "/v1/nodes/n1/claim?wait=soon", "wait must be a number of seconds, got 'soon'"),
        (
            "GET",
            "/v1/runs/r1/steps/1/log?name=..",
            "name must be 1-200 characters of [A-Za-z0-9._:@-], got '..'",
        ),
    ],
)
def test_a_query_parameter_its_schema_refuses_is_a_400_naming_it(client, method, url, reason):
    placed_on_n1(client)

    resp = client.open(url, method=method, data=b"")

    assert (resp.status_code, error_of(resp)) == (400, reason), resp.get_json()


def test_a_progress_attempt_past_its_bound_is_a_400(client):
    placed_on_n1(client)

    resp = client.put("/v1/runs/r1/steps/1/log?progress=1&attempt=9999999999", data=b"x")

    assert (resp.status_code, error_of(resp)) == (400, "invalid attempt")


def test_a_limit_that_fits_twelve_digits_is_clamped_to_1000(client):
    placed_on_n1(client)

    resp = client.get("/v1/runs?limit=999999999999")

    assert resp.status_code == 200 and len(resp.get_json()["runs"]) == 1


# ------------------------------------------------------------------ NUL in queries and headers


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("work=%00", "work"),
        ("work=g%3A1%00", "work"),
        ("state=RUNNING%00", "state"),
        ("since=%00", "since"),
        ("since=2026-01-01T00:00:00Z%00", "since"),
        ("before=2026-01-01T00:00:00Z,a%00", "before"),
        ("before=%002026-01-01T00:00:00Z,a", "before"),
        ("limit=1%00", "limit"),
    ],
)
def test_a_nul_in_a_run_list_parameter_is_a_400_naming_it(client, query, parameter):
    placed_on_n1(client)

    resp = client.get(f"/v1/runs?{query}")

    assert resp.status_code == 400, resp.get_json()
    assert error_of(resp).startswith(f"{parameter} must "), error_of(resp)


@pytest.mark.parametrize(
    ("method", "url", "header"),
    [
        ("GET", "/v1/runs", "X-Enode-Principal"),
        ("POST", "/v1/runs/r1/cancel", "X-Enode-Principal"),
        ("POST", "/v1/nodes/n1/claim?wait=0", "X-Enode-Instance"),
    ],
)
def test_a_nul_in_a_header_is_a_400_naming_the_header(client, sql, method, url, header):
    placed_on_n1(client)

    resp = client.open(url, method=method, headers={header: "qa\x00@example.com"})

    assert resp.status_code == 400
    assert error_of(resp) == f"{header} must be at most 200 characters, without NUL"
    assert one(sql, "select state from runs")["state"] == "RUNNING"


def _routes(app: Any) -> list[tuple[str, str]]:
    """Every /v1 route with a path parameter, as (method, rule)."""
    out = []
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/v1/") or not rule.arguments:
            continue
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            out.append((method, rule.rule))
    return out


_VALID = {"run_id": "r1", "seq": "1", "name": "result.json", "node_id": "n1"}
_BODIES: dict[str, Any] = {"result": {"node": "n1", "exit_code": 0}, "answer": {"ok": True}}


@pytest.mark.parametrize("bad", ["a%00b", "%00", "a%0Ab", "%C2%85", "a%ED%A0%80"])
def test_a_nul_or_control_character_in_any_path_parameter_is_a_4xx_never_a_5xx(
    app, client, sql, bad
):
    placed_on_n1(client)
    routes = _routes(app)
    assert len(routes) >= 12, routes
    seen = []
    for method, rule in routes:
        for arg in sorted({a for a in _VALID if f"<{a}>" in rule}):
            url = rule
            for name, value in _VALID.items():
                url = url.replace(f"<{name}>", bad if name == arg else value)
            kind = rule.rsplit("/", 1)[-1]
            if method == "PUT":
                resp = client.open(url, method=method, data=b"{}")
            else:
                resp = client.open(url, method=method, json=_BODIES.get(kind))
            seen.append((method, url, resp.status_code))

    # Bytes that are not UTF-8 (a surrogate's encoding) reach the app as U+FFFD, which a blob
    # name may hold; every other value here is refused.
    refused = [s for s in seen if bad != "a%ED%A0%80" or "/blob/" not in s[1]]
    assert [s for s in seen if s[2] >= 500] == []
    assert [s for s in refused if not 400 <= s[2] < 500] == []
    assert one(sql, "select state from runs")["state"] == "RUNNING"


@settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    parameter=st.sampled_from(["state", "since", "work", "limit", "before"]),
    value=st.text(max_size=40)
    | st.sampled_from(
        ["2026-01-01T00:00:00+23:59", "0001-01-01T00:00:00+14:00,a", "9999-12-31T23:59:59-23:59,x"]
    ),
)
def test_any_run_list_parameter_is_answered_200_or_400_never_a_5xx(client, parameter, value):
    resp = client.get("/v1/runs", query_string={parameter: value})

    assert resp.status_code in (200, 400), (parameter, value, resp.get_json(silent=True))
    if resp.status_code == 400:
        assert error_of(resp).startswith(parameter), (parameter, value, error_of(resp))


# ------------------------------------------------------------------ lone surrogates in bodies


def test_a_lone_surrogate_in_a_contract_is_a_400_naming_the_field_and_stores_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    raw = (
        '{"run_id": "r1", "requires": [{"as": "dut", "capability": "board"}],'
        ' "steps": [{"id": "s", "uses": "dut", "run": ["echo", "\\ud800"]}]}'
    )

    resp = client.post("/v1/runs", data=raw, content_type="application/json")
    dry = client.post("/v1/runs/dry-run", data=raw, content_type="application/json")

    assert resp.status_code == 400
    assert error_of(resp) == "steps[0].run[1]: a string may not contain a lone surrogate"
    assert (dry.status_code, error_of(dry)) == (400, error_of(resp))
    assert find_run(sql, "r1") is None


def test_a_lone_surrogate_in_an_advert_or_a_result_becomes_u_fffd_like_a_nul(client, sql):
    raw = (
        '{"node_id": "n1", "label": "lab \\udc80", "capabilities":'
        ' [{"capability": "board", "attrs": {"room\\ud800": "b\\udfff"}}]}'
    )
    assert client.post("/v1/nodes", data=raw, content_type="application/json").status_code == 200
    submit(client, contract("r1", role("dut")), 201)
    step = claimed(client, "n1")
    result = '{"node": "n1", "exit_code": 0, "produced": [], "error": "", "diagnostics": "\\ud83d"}'

    resp = client.post(
        f"/v1/runs/r1/steps/{step['seq']}/result", data=result, content_type="application/json"
    )

    assert resp.status_code == 200, resp.get_json()
    node = one(sql, "select label, capabilities from nodes")
    assert node["label"] == "lab \ufffd"
    assert node["capabilities"] == [{"capability": "board", "attrs": {"room\ufffd": "b\ufffd"}}]
    assert step_row(sql, "r1", 1, "result")["result"]["diagnostics"] == "\ufffd"


# ------------------------------------------------------------------ ids matched whole

# ``re.match`` with ``^…$`` takes a trailing newline (``$`` matches before one): such a node id
# could be leased but never claim, and would show as a second tile beside "n1".


def test_an_advert_whose_node_id_ends_in_a_newline_is_a_400_naming_node_id(client, sql):
    resp = client.post("/v1/nodes", json={"node_id": "n1\n", "capabilities": [cap("board")]})

    assert resp.status_code == 400
    assert error_of(resp) == "node_id: String does not match expected pattern."
    assert scalar(sql, "select count(*) from nodes") == 0


def test_an_advert_whose_capability_ends_in_a_newline_is_a_400_naming_it(client, sql):
    resp = client.post("/v1/nodes", json={"node_id": "n1", "capabilities": [cap("board\n")]})

    assert resp.status_code == 400
    assert error_of(resp) == "capabilities[0].capability: String does not match expected pattern."
    assert scalar(sql, "select count(*) from nodes") == 0


def test_a_result_whose_node_ends_in_a_newline_is_a_400_naming_node(client, sql):
    placed_on_n1(client)
    step = claimed(client, "n1")

    resp = report(client, "r1", step["seq"], "n1\n")

    assert resp.status_code == 400
    assert error_of(resp) == "node: String does not match expected pattern."
    assert step_row(sql, "r1", 1, "state")["state"] == "CLAIMED"


# ------------------------------------------------------------------ control characters in names

CONTROL = ["\n", "\r", "\t", "\x1b", "\x7f", "\x85", "\x9f"]
CONTROL_IDS = ["LF", "CR", "TAB", "ESC", "DEL", "NEL", "APC"]


@pytest.mark.parametrize("char", CONTROL, ids=CONTROL_IDS)
@pytest.mark.parametrize(
    "where",
    ["out", "in.from", "ask.out", "ask.show", "loop.until.produced", "success_when.produced"],
)
def test_an_artifact_name_with_a_control_character_is_a_400_naming_the_field(
    client, sql, where, char
):
    advertise(client, "n1", cap("board"))
    doc, path = contract_naming(where, f"de{char}cision")

    resp = submit(client, doc)

    assert resp.status_code == 400, resp.get_json()
    assert error_of(resp).startswith(f"{path} must not contain a control character"), error_of(resp)
    assert find_run(sql, "r1") is None


def test_a_prompt_may_still_hold_a_newline(client):
    advertise(client, "n1", cap("board"))
    ask = {"id": "q", "ask": {"prompt": "Boot log\nlooks right?"}, "out": ["decision"]}

    resp = submit(client, contract("r1", role("dut"), steps=[ask]))

    assert resp.status_code in (201, 202), resp.get_json()


@pytest.mark.parametrize("char", CONTROL, ids=CONTROL_IDS)
def test_an_upload_name_with_a_control_character_is_a_400_naming_name_and_stores_nothing(
    client, sql, ctx, char
):
    placed_on_n1(client)

    resp = client.put(f"/v1/runs/r1/steps/1/blob/{quote('result' + char + '.json')}", data=b"{}")

    assert resp.status_code == 400
    assert error_of(resp).startswith("name must not contain a control character")
    assert scalar(sql, "select count(*) from blobs") == 0
    assert not (ctx.records.path("r1") / "blobs").exists() or not any(
        (ctx.records.path("r1") / "blobs").iterdir()
    )


@pytest.mark.parametrize("char", CONTROL, ids=CONTROL_IDS)
def test_a_log_name_with_a_control_character_is_a_400_naming_name(client, char):
    placed_on_n1(client)

    put = client.put("/v1/runs/r1/steps/1/log", query_string={"name": f"a{char}b"}, data=b"x\n")
    get = client.get("/v1/runs/r1/steps/1/log", query_string={"name": f"a{char}b"})

    assert (put.status_code, get.status_code) == (400, 400)
    assert error_of(put).startswith("name must be") and error_of(get).startswith("name must be")


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils sha256sum")
def test_a_sealed_record_passes_sha256sum_check_with_every_kind_of_file(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("scope"))
    steps = [
        {"id": "build", "uses": "dut", "run": ["make"], "out": ["result.json", "build log é.txt"]},
        {
            "id": "more",
            "acquire": {"want": role("probe", "scope"), "acquired": "probe", "unavailable": "none"},
        },
        {"id": "probe", "uses": "probe", "run": ["probe"]},
        {"id": "none", "uses": "dut", "run": ["true"]},
        {
            "id": "sign-off",
            "needs": ["probe"],
            "ask": {"prompt": "Looks\nright?"},
            "out": ["decision"],
        },
    ]
    submit(client, contract("r1", role("dut"), steps=steps), 201)
    build = claimed(client, "n1")
    root = f"/v1/runs/r1/steps/{build['seq']}"
    assert client.put(f"{root}/blob/result.json", data=b'{"ok": true}\n').status_code == 204
    assert client.put(f"{root}/blob/{quote('build log é.txt')}", data=b"a\nb\n").status_code == 204
    assert client.put(f"{root}/blob/_cannot", data=b"feedback\n").status_code == 204
    assert client.put(f"{root}/log", data=b"compiling\n").status_code == 200
    assert client.put(f"{root}/log?name=make.out", data=b"ok\n").status_code == 200
    assert client.put(f"{root}/log?progress=1&attempt=0", data=b"live\n").status_code == 200
    done(client, "r1", build["seq"], "n1", produced=["result.json", "build log é.txt"])
    probe = claimed(client, "n2")
    done(client, "r1", probe["seq"], "n2")
    answer = client.post("/v1/runs/r1/steps/5/answer", json={"verdict": "approve"})
    assert answer.status_code == 200, answer.get_json()
    assert one(sql, "select state, sealed_at is not null as sealed from runs") == {
        "state": "SUCCEEDED",
        "sealed": True,
    }
    record = ctx.records.path("r1")
    files = sorted(
        str(p.relative_to(record))
        for p in record.rglob("*")
        if p.is_file() and p.name != "SHA256SUMS"
    )

    check = subprocess.run(
        ["sha256sum", "--strict", "-c", "SHA256SUMS"],
        cwd=record,
        capture_output=True,
        text=True,
        check=False,
    )

    assert check.returncode == 0, check.stdout + check.stderr
    checked = sorted(line.rsplit(": ", 1)[0] for line in check.stdout.splitlines())
    assert checked == files
    assert all(line.endswith(": OK") for line in check.stdout.splitlines())
    assert {"blobs/01.0-build log é.txt", "blobs/05.0-decision", "blobs/02.0-more"} <= set(files)
