"""The OpenAPI document (route 21) says what the Mediator does: the contract's documented schema
takes every contract the validator takes and refuses most of what it refuses; errors are the
Mediator's one error body; path parameters carry their grammar; token routes carry the bearer
scheme; docs/api.md covers every documented route."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from jsonschema import Draft202012Validator

from app.contract import validate_contract
from app.errors import BadRequest
from tests.support import strategies
from tests.support.apps import ROOT, openapi_document

# One gunicorn for the module, its tables emptied before each test (tests/conftest.py).
one_server_per_module = True

TOKENLESS = {"/healthz", "/readyz"}
# Open by default; metrics.require_token makes it ask for any valid token (docs/api.md#get-metrics).
TOKEN_WHEN_CONFIGURED = {"/metrics"}


DOCUMENT = openapi_document()


def component(name: str) -> Draft202012Validator:
    """A validator of ``#/components/schemas/<name>`` of the served document (OpenAPI 3.1:
    its schemas are JSON Schema 2020-12)."""
    root = {"$ref": f"#/components/schemas/{name}", "components": DOCUMENT["components"]}
    return Draft202012Validator(root)


CONTRACT = component("Contract")
METHODS = {"get", "put", "post", "delete", "patch"}


def operations() -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, operation) of every documented operation."""
    return [
        (method, path, op)
        for path, item in DOCUMENT["paths"].items()
        for method, op in item.items()
        if method in METHODS
    ]


def accepted(doc: Any) -> bool:
    try:
        validate_contract(doc)
    except BadRequest:
        return False
    return True


def _module_of(path: Path) -> dict[str, Any] | None:
    """The namespace of the test module at ``path`` (imported under a name of its own), or None
    when it cannot be imported alone."""
    name = "contracts_of_" + "_".join(path.relative_to(ROOT).with_suffix("").parts)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit):  # a script that reads its command line, say
        return None
    return vars(module)


# Suites whose modules start processes or read a command line: no contract builders there.
SKIPPED_SUITES = {"storm", "perf", "crash", "dbfaults", "agent_e2e", "live", "concurrency"}
FIXTURE_NAMES = {"client", "sql", "app", "ctx", "live", "live_server", "server", "db_url"}


def _is_builder(value: Any) -> bool:
    """A plain function of the tests that builds a contract (``contract``, ``role``,
    ``with_step``, ...): not a test, taking no fixture, and about runs."""
    if not inspect.isfunction(value) or value.__name__.startswith("test_"):
        return False
    if not (value.__module__ or "").startswith(("tests.support.contracts", "contracts_of_")):
        return False
    if FIXTURE_NAMES & set(inspect.signature(value).parameters):
        return False
    try:
        source = inspect.getsource(value)
    except OSError:  # made at run time
        return False
    return ("steps" in source or "run_id" in source) and "client" not in source


def spelled_out_contracts() -> list[Any]:
    """Every contract the tests spell out: each dict literal, and each call of a builder of the
    tests, that evaluates with the names of its module alone (a fixture's value or a local
    variable leaves it out) to an object with ``run_id`` and ``steps``."""
    found: dict[str, Any] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        skipped = SKIPPED_SUITES & set(path.relative_to(ROOT / "tests").parts)
        if skipped or "steps" not in text or path.name == "conftest.py":
            continue
        if path == Path(__file__).resolve():
            continue
        namespace = _module_of(path)
        if namespace is None:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                func = node.func
                if not (isinstance(func, ast.Name) and _is_builder(namespace.get(func.id))):
                    continue
            elif not isinstance(node, ast.Dict):
                continue
            try:
                value = eval(  # the tests' own builders, on their own literals
                    compile(ast.Expression(node), str(path), "eval"), dict(namespace)
                )
            except Exception:
                continue
            if isinstance(value, dict) and {"run_id", "steps"} <= set(value):
                try:
                    text = json.dumps(value, sort_keys=True)
                except (TypeError, ValueError):
                    continue  # not a JSON document
                found.setdefault(text, json.loads(text))
    return list(found.values())


LITERALS = spelled_out_contracts()


def test_the_tests_hold_many_contract_literals() -> None:
    assert len(LITERALS) > 50
    assert sum(accepted(c) for c in LITERALS) > 30


@pytest.mark.parametrize("index", range(len(LITERALS)))
def test_every_contract_the_validator_takes_in_the_tests_is_valid_by_the_document(
    index: int,
) -> None:
    doc = LITERALS[index]
    if accepted(doc):
        errors = [e.message for e in CONTRACT.iter_errors(doc)]
        assert errors == [], json.dumps(doc)[:500]


def test_the_document_refuses_most_literal_contracts_the_validator_refuses() -> None:
    refused = [c for c in LITERALS if not accepted(c)]
    caught = [c for c in refused if not CONTRACT.is_valid(c)]
    assert len(refused) > 20
    # The rest break a rule between steps and roles, which JSON Schema cannot state.
    assert len(caught) >= len(refused) // 2, (len(caught), len(refused))


def test_generated_contracts_the_validator_takes_are_valid_by_the_document() -> None:
    outcomes: list[tuple[bool, bool]] = []

    @settings(
        max_examples=400,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategies.contract)
    def check(doc: Any) -> None:
        takes = accepted(doc)
        valid = CONTRACT.is_valid(doc)
        if takes:
            assert valid, [e.message for e in CONTRACT.iter_errors(doc)]
        outcomes.append((takes, valid))

    check()
    taken = [v for t, v in outcomes if t]
    refused = [v for t, v in outcomes if not t]
    assert len(taken) > 50 and len(refused) > 50
    # Most refusals are of a shape the schema states; the others are references between steps.
    assert refused.count(False) >= 0.7 * len(refused), (refused.count(False), len(refused))


def test_valid_contracts_of_every_step_kind_are_valid_by_the_document() -> None:
    doc = {
        "run_id": "kinds",
        "work": {"id": {"system": "gerrit", "change_id": "4711"}, "patchset": 2},
        "requires": [{"as": "dut", "capability": "board", "soc": "imx8mp", "count": 1}],
        "steps": [
            {"id": "grab", "acquire": {"want": {"as": "probe", "capability": "scope"},
                                       "acquired": "measure", "unavailable": "skip"}},
            {"id": "measure", "uses": "probe", "run": ["measure"], "out": ["m.json"],
             "release": ["probe"]},
            {"id": "skip", "uses": "dut", "run": ["true"]},
            {"id": "think", "uses": "dut", "agent": {"model": "m", "max_turns": 3, "mcp": ["x"]},
             "in": {"prompt": "go", "from": ["m.json"]}, "out": ["plan.json"],
             "see": {"ledger": "list"}, "feedback": ["f"],
             "workspace": {"repo": "r", "rev": "main"}, "collect": {"plan.json": "out/plan"},
             "env": ["HOME"]},
            {"id": "pick", "uses": "dut", "run": ["pick"], "out": ["choice.json"],
             "dispatch": {"from": "choice.json.way", "to": ["left", "right"]}},
            {"id": "left", "uses": "dut", "run": ["l"]},
            {"id": "right", "uses": "dut", "run": ["r"], "out": ["r.txt"],
             "loop": {"back_to": "pick", "max": 3, "until": {"exit_code": 0}}},
            {"id": "work", "uses": "dut", "run": ["w"], "validate_with": "check",
             "max_attempts": 2},
            {"id": "check", "uses": "dut", "run": ["c"]},
            {"id": "sign-off", "ask": {"prompt": "ok?", "answerers": ["qa@example.com"],
                                       "timeout": {"after": "1h30m", "then": "fail"},
                                       "show": ["r.txt"]},
             "out": ["decision"],
             "schema": {"decision": {"type": "object", "required": ["verdict"],
                                     "properties": {"verdict": {"enum": ["ok", "no"]}}}}},
        ],
        "success_when": [
            {"step": "right", "exit_code": 0, "produced": ["r.txt"], "within_attempts": True},
            {"step": "think", "changed": ["src/a.c"]},
            {"fleet_has": {"capability": "board"}, "min_count": 1},
        ],
        "ledger": {"scope": "work"},
        "queue": {"timeout": "250ms"},
        "lease": {"seconds": 5},
    }  # fmt: skip
    assert accepted(doc)
    assert [e.message for e in CONTRACT.iter_errors(doc)] == []


@pytest.mark.parametrize(
    "change",
    [
        {"steps": [{"id": "a", "uses": "dut", "run": ["x"], "ask": {"prompt": "?"}}]},
        {"steps": [{"id": "a", "uses": "dut"}]},
        {"steps": [{"id": "a", "run": ["x"]}]},
        {"steps": [{"id": "a", "ask": {"prompt": "?"}, "out": ["d"], "uses": "dut"}]},
        {"steps": [{"id": "a", "uses": "dut", "agent": {"bogus": 1}}]},
        {"steps": [{"id": "a", "uses": "dut", "run": ["x"], "in": {"bogus": 1}}]},
        {"steps": [{"id": "a", "uses": "dut", "run": ["x"], "out": ["_private"]}]},
        {"steps": [{"id": "a", "uses": "dut", "run": ["x"], "out": ["o"],
                    "schema": {"o": {"$ref": "#/x"}}}]},
        {"requires": [{"as": "dut", "capability": "Board"}]},
        {"requires": [{"as": "dut", "capability": "board", "soc": 5}]},
        {"requires": []},
        {"run_id": "no spaces"},
        {"queue": {"timeout": "soon"}},
        {"ledger": {"scope": "everything"}},
        {"work": {"bogus": 1}},
        {"success_when": [{"step": "a", "fleet_has": {"capability": "board"}}]},
    ],
)  # fmt: skip
def test_contracts_of_a_wrong_shape_are_refused_by_both(change: dict[str, Any]) -> None:
    doc = {
        "run_id": "r",
        "requires": [{"as": "dut", "capability": "board"}],
        "steps": [{"id": "a", "uses": "dut", "run": ["x"]}],
        **change,
    }
    assert not accepted(doc)
    assert not CONTRACT.is_valid(doc)


def test_every_error_response_is_the_mediators_error_body() -> None:
    assert "Error" in DOCUMENT["components"]["schemas"]
    error = DOCUMENT["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]
    detail = DOCUMENT["components"]["schemas"]["ErrorDetail"]
    assert set(detail["properties"]) == {"code", "reason"}
    for method, path, op in operations():
        assert "default" not in op["responses"], (method, path)
        for status, reply in op["responses"].items():
            assert reply["description"] not in ("ok", ""), (method, path, status)
            if int(status) >= 400 and path != "/readyz":
                schema = reply["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}, (method, path)


def test_token_routes_carry_the_bearer_scheme_and_its_401_and_403() -> None:
    scheme = DOCUMENT["components"]["securitySchemes"]["bearer"]
    assert scheme == {**scheme, "type": "http", "scheme": "bearer"}
    for method, path, op in operations():
        if path in TOKENLESS:
            assert op["security"] == [], path
            assert "401" not in op["responses"]
        elif path in TOKEN_WHEN_CONFIGURED:
            assert op["security"] == [{}, {"bearer": []}], path
            assert "401" in op["responses"] and "403" not in op["responses"], path
        else:
            assert op["security"] == [{"bearer": []}], (method, path)
            assert {"401", "403"} <= set(op["responses"]), (method, path)


def test_path_parameters_carry_their_grammar() -> None:
    for path, item in DOCUMENT["paths"].items():
        params = {p["name"]: p for p in item.get("parameters", []) if p["in"] == "path"}
        assert set(params) == set(re.findall(r"{(\w+)}", path)), path
        for name, p in params.items():
            schema = p["schema"]
            if name == "seq":
                assert schema["type"] == "integer" and schema["minimum"] == 1
            else:
                assert schema["maxLength"] == 200 and "pattern" in schema, (path, name)


def test_binary_routes_say_their_content_types() -> None:
    paths = DOCUMENT["paths"]
    record = paths["/v1/runs/{run_id}/record"]["get"]["responses"]["200"]["content"]
    blob = paths["/v1/runs/{run_id}/blob/{name}"]["get"]["responses"]["200"]["content"]
    log = paths["/v1/runs/{run_id}/steps/{seq}/log"]["get"]["responses"]["200"]["content"]
    put_blob = paths["/v1/runs/{run_id}/steps/{seq}/blob/{name}"]["put"]["requestBody"]
    assert set(record) == {"application/x-tar"}
    assert set(blob) == {"application/octet-stream"}
    assert set(log) == {"text/plain"}
    assert set(put_blob["content"]) == {"application/octet-stream"}


def test_docs_api_md_mentions_every_documented_route() -> None:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    routes = [f"{method.upper()} {path}" for method, path, _ in operations()]
    assert len(routes) == 29
    missing = [route for route in routes if route not in text]
    assert missing == []


def query_parameters(path: str, method: str) -> dict[str, Any]:
    """The query parameters of one operation: name -> schema type."""
    op = DOCUMENT["paths"][path][method]
    return {
        p["name"]: p["schema"].get("type") for p in op.get("parameters", []) if p["in"] == "query"
    }


def test_the_query_parameters_the_routes_parse_with_schemas_are_documented_from_them() -> None:
    log = "/v1/runs/{run_id}/steps/{seq}/log"

    assert query_parameters("/v1/runs", "get") == {
        "state": "string",
        "since": "string",
        "work": "string",
        "team": "string",
        "limit": "integer",
        "before": "string",
    }
    assert query_parameters("/v1/nodes/{node_id}/claim", "post") == {"wait": "number"}
    assert query_parameters(log, "get") == {"name": "string", "from": "integer"}
    assert query_parameters(log, "put") == {
        "name": "string",
        "progress": "string",
        "attempt": "string",
    }
