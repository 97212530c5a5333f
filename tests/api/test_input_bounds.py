"""Bounded input (SPEC §13, §18, §19.3, §19.5): an exit code is taken up to 64 bits and every other
integer the API takes is bounded before it reaches a 32-bit column; no query parameter, header, path
segment or body brings the database a NUL or a lone surrogate; no name that becomes a file of the
Record holds a control character, so a sealed Record passes ``sha256sum -c``. Each is a 4xx naming
the field, never a 500, never a partial write."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from alembic import command

from app.config import to_libpq_url
from app.migrate import alembic_config
from tests.agent import claimed, done, report
from tests.helpers import advertise, cap, contract, role, submit
from tests.rows import find_run, one, scalar, step_row

one_app_per_module = True

INT4_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def error_of(resp: Any) -> str:
    """The reason of an error body, checked to be exactly ``{"error": {"code", "reason"}}``."""
    body = resp.get_json(silent=True)
    assert isinstance(body, dict) and set(body) == {"error"}, resp.data[:300]
    assert body["error"]["code"] == resp.status_code
    return body["error"]["reason"]


def placed(client: Any, *steps: dict[str, Any]) -> None:
    """r1 RUNNING on n1 with ``steps`` (default: one run step producing result.json)."""
    advertise(client, "n1", cap("board"))
    body = list(steps) or [{"id": "work", "uses": "dut", "run": ["x"], "out": ["result.json"]}]
    submit(client, contract("r1", role("dut"), steps=body), 201)


# ------------------------------------------------------------------ exit codes


@pytest.mark.parametrize(
    "code",
    [3221225477, INT4_MAX + 1, INT64_MAX, INT64_MIN, -1073741819],
    ids=["windows-access-violation", "int4-max+1", "int64-max", "int64-min", "negative-ntstatus"],
)
def test_an_exit_code_any_operating_system_reports_is_taken_stored_and_shown(client, sql, code):
    placed(client)
    step = claimed(client, "n1")

    reply = done(client, "r1", step["seq"], "n1", exit_code=code)

    assert reply["run_state"] == "SUCCEEDED"
    assert step_row(sql, "r1", 1, "exit_code")["exit_code"] == code
    view = client.get("/v1/runs/r1").get_json()
    assert view["steps"][0]["exit_code"] == code


def test_a_sealed_record_keeps_an_exit_code_beyond_32_bits(client, ctx):
    placed(client)
    step = claimed(client, "n1")
    done(client, "r1", step["seq"], "n1", exit_code=3221225477)

    doc = (ctx.records.path("r1") / "steps" / "01-work.json").read_text()

    assert '"exit_code": 3221225477' in doc or '"exit_code":3221225477' in doc


@pytest.mark.parametrize("code", [INT64_MAX + 1, INT64_MIN - 1, 10**30, -(10**30)])
def test_an_exit_code_beyond_64_bits_is_a_400_naming_exit_code_and_changes_nothing(
    client, sql, code
):
    placed(client)
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
    "steps[1].loop.until.exit_code",
    "steps[0].max_attempts",
    "steps[0].agent.max_turns",
    "steps[0].agent.max_tokens",
    "success_when[0].exit_code",
    "success_when[0].min_count",
    "work.patchset",
]


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
    placed(client)

    resp = client.get(url)

    assert resp.status_code == 400 and error_of(resp).startswith(reason), resp.get_json()


def test_a_progress_attempt_past_its_bound_is_a_400(client):
    placed(client)

    resp = client.put("/v1/runs/r1/steps/1/log?progress=1&attempt=9999999999", data=b"x")

    assert (resp.status_code, error_of(resp)) == (400, "invalid attempt")


def test_a_limit_that_fits_twelve_digits_is_clamped_to_1000(client):
    placed(client)

    resp = client.get("/v1/runs?limit=999999999999")

    assert resp.status_code == 200 and len(resp.get_json()["runs"]) == 1
