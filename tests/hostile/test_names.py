"""Hostile names in URLs (docs/reliability.md#what-these-tests-found): run ids, step seqs, blob and
log names that try to leave the Record directory (``..``, ``%2e%2e``, encoded slashes and
backslashes), or hold NUL, control characters, overlong or invalid UTF-8, or too many characters.
Every one is a 4xx — an id no run has is a 404 on GET and PUT, a ``{seq}`` that is not a positive
integer a 400, a result or answer for nothing claimed or asked a 409 — never a 5xx; nothing is
written outside the Record store and nothing outside it is ever served.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from tests.support.actors import cap
from tests.support.agent import advertise, claimed
from tests.support.apps import app_on
from tests.support.contracts import contract, role
from tests.support.submitter import submit

SECRET = b"the operator's secret, outside the Record store"

# As sent on the wire: every % here reaches the server as written.
NAMES = [
    "..",
    ".",
    "...",
    "%2e%2e",
    "%2E%2E",
    ".%2e",
    "..%2f..%2fsecret.txt",
    "%2e%2e%2f%2e%2e%2fsecret.txt",
    "..%5c..%5csecret.txt",
    "a%2fb",
    "%2fetc%2fpasswd",
    "%00",
    "a%00b",
    "run-a%00",
    "a%0ab",
    "a%0d%0ab",
    "a%09b",
    "a%1b%5b31m",
    "%7f",
    "%c2%85",
    "%e2%80%a8",
    "%c0%ae%c0%ae",
    "%ff%fe",
    "%ed%a0%80",
    "%c3%a9",
    "a%20b",
    "a%3fb",
    "a%23b",
    "a;b",
    "~root",
    "x" * 201,
    "x" * 5000,
]
# Those of NAMES that hold a control character (C0, DEL, C1) once decoded: refused with a 400
# naming the name, so no line of the sealed Record's SHA256SUMS can be split
# (docs/security.md#runs-records-and-uploads).
CONTROL = {"%00", "a%00b", "run-a%00", "a%0ab", "a%0d%0ab", "a%09b", "a%1b%5b31m", "%7f", "%c2%85"}
SEQS = ["0", "-1", "1.0", "1e3", "0x1", "%ef%bc%91", "%00", "1%00", "99999999999999999999", "%20"]


# One app for the module (closing an app that served a claim waits for its LISTEN thread, and
# every test here claims); each test still starts from empty tables and an empty Record store.
one_app_per_module = True


@pytest.fixture(scope="module")
def area(tmp_path_factory: Any) -> Path:
    """Where the Record store lives, two levels down: ``area/store/records``. A name that climbs
    out of it lands in ``area`` or ``area/store``, which the tests watch."""
    area = tmp_path_factory.mktemp("names")
    (area / "store").mkdir()
    return area


@pytest.fixture(scope="module")
def module_app(session_db: str, area: Path) -> Iterator[Flask]:
    with app_on(session_db, area / "store" / "records") as application:
        yield application


@pytest.fixture
def claimed_run(client: Any, area: Path) -> str:
    """Run ``run-a`` on node n1, its step 1 claimed; secret files beside the Record store."""
    for secret in (area / "secret.txt", area / "store" / "secret.txt"):
        secret.write_bytes(SECRET)
    advertise(client, "n1", cap("board"))
    doc = contract(
        "run-a", role("dut"), steps=[{"id": "work", "uses": "dut", "run": ["x"], "out": ["out"]}]
    )
    submit(client, doc, 201)
    claimed(client, "n1")
    return "run-a"


def files_outside_records(area: Path) -> list[str]:
    records = area / "store" / "records"
    return sorted(
        f"{p.relative_to(area)}:{p.read_bytes()[:60]!r}"
        for p in area.rglob("*")
        if p.is_file() and records not in p.parents
    )


def assert_4xx(resp: Any, allowed: set[int], what: str) -> None:
    assert resp.status_code in allowed, (what, resp.status_code, resp.get_data()[:300])
    if resp.status_code >= 400:
        body = resp.get_json(silent=True)
        assert isinstance(body, dict) and body["error"]["code"] == resp.status_code, (what, body)
    assert SECRET not in resp.get_data(), what


@pytest.mark.parametrize("name", NAMES)
def test_a_hostile_run_id_is_a_404_on_every_get_and_put(
    client: Any, claimed_run: str, area: Path, name: str
) -> None:
    before = files_outside_records(area)
    for path in (
        f"/v1/runs/{name}",
        f"/v1/runs/{name}/events",
        f"/v1/runs/{name}/ledger",
        f"/v1/runs/{name}/record",
        f"/v1/runs/{name}/steps/1/log",
        f"/v1/runs/{name}/blob/out",
    ):
        assert_4xx(client.get(path), {404}, path)
    for path in (f"/v1/runs/{name}/steps/1/log", f"/v1/runs/{name}/steps/1/blob/out"):
        assert_4xx(client.put(path, data=b"data"), {404}, path)
    assert files_outside_records(area) == before


@pytest.mark.parametrize("name", NAMES)
def test_a_hostile_run_id_is_a_4xx_on_cancel_result_answer_and_claim(
    client: Any, claimed_run: str, name: str
) -> None:
    # A name with an encoded slash reaches the server decoded, so it matches no route: 404.
    no_route = {404} if "%2f" in name.lower() else set()
    assert_4xx(client.post(f"/v1/runs/{name}/cancel"), {404}, "cancel")
    body = {"node": "n1", "exit_code": 0}
    result = client.post(f"/v1/runs/{name}/steps/1/result", json=body)
    assert_4xx(result, {409} | no_route, "result")
    answer = client.post(f"/v1/runs/{name}/steps/1/answer", json={})
    assert_4xx(answer, {409} | no_route, "answer")
    # Node ids share the run_id grammar: "." and ".." are ids (of no node here: 204), a name
    # that could never be one is a 400.
    assert_4xx(client.post(f"/v1/nodes/{name}/claim?wait=0"), {204, 400} | no_route, "claim")


@pytest.mark.parametrize("seq", SEQS)
def test_a_seq_that_is_not_a_positive_integer_is_a_400(
    client: Any, claimed_run: str, seq: str
) -> None:
    for method, path, body in (
        ("GET", f"/v1/runs/run-a/steps/{seq}/log", None),
        ("PUT", f"/v1/runs/run-a/steps/{seq}/log", b"line\n"),
        ("PUT", f"/v1/runs/run-a/steps/{seq}/blob/out", b"data"),
        ("POST", f"/v1/runs/run-a/steps/{seq}/result", b'{"node": "n1", "exit_code": 0}'),
        ("POST", f"/v1/runs/run-a/steps/{seq}/answer", b"{}"),
    ):
        resp = client.open(path, method=method, data=body, content_type="application/json")
        assert_4xx(resp, {400}, f"{method} {path}")


@pytest.mark.parametrize("name", NAMES)
def test_a_hostile_blob_name_never_leaves_the_record_store(
    client: Any, claimed_run: str, area: Path, name: str
) -> None:
    before = files_outside_records(area)
    put = client.put(f"/v1/runs/run-a/steps/1/blob/{name}", data=b"planted")
    assert_4xx(put, {400} if name in CONTROL else {204, 400, 404}, "put blob")
    got = client.get(f"/v1/runs/run-a/blob/{name}")
    assert_4xx(got, {200, 400, 404}, "get blob")
    if got.status_code == 200:
        # Stored under that very name, inside the Record: it reads back what was put.
        assert put.status_code == 204 and got.get_data() == b"planted"
    assert files_outside_records(area) == before


@pytest.mark.parametrize("name", NAMES)
def test_a_hostile_log_name_never_leaves_the_record_store(
    client: Any, claimed_run: str, area: Path, name: str
) -> None:
    before = files_outside_records(area)
    put = client.put(f"/v1/runs/run-a/steps/1/log?name={name}", data=b"planted\n")
    assert_4xx(put, {400} if name in CONTROL else {200, 400}, "put log")
    got = client.get(f"/v1/runs/run-a/steps/1/log?name={name}")
    assert_4xx(got, {200, 400, 404}, "get log")
    if put.status_code == 400:
        assert got.status_code != 200 or got.get_data() == b"", got.get_data()
    assert files_outside_records(area) == before


def test_names_that_are_valid_but_unknown_are_a_404(client: Any, claimed_run: str) -> None:
    assert_4xx(client.get("/v1/runs/run-b"), {404}, "unknown run")
    assert_4xx(client.get("/v1/runs/run-a/blob/never-put"), {404}, "unknown blob")
    assert_4xx(client.put("/v1/runs/run-a/steps/9/log", data=b"x"), {404}, "unknown step")


@pytest.mark.parametrize("run_id", ["..", ".", "...", ".hidden", "..:@-"])
def test_a_run_whose_id_looks_like_a_path_keeps_its_record_inside_the_store(
    client: Any, area: Path, run_id: str
) -> None:
    """Such ids are valid (the grammar of docs/contract.md#top-level allows dots); their Record
    directory is named so that it cannot be the store's parent or the store itself."""
    before = files_outside_records(area)
    advertise(client, "n1", cap("board"))
    doc = contract(
        run_id, role("dut"), steps=[{"id": "work", "uses": "dut", "run": ["x"], "out": ["out"]}]
    )
    submit(client, doc, 201)
    step = claimed(client, "n1")
    assert step["run_id"] == run_id
    assert client.put(f"/v1/runs/{run_id}/steps/1/log", data=b"line\n").status_code == 200
    assert client.put(f"/v1/runs/{run_id}/steps/1/blob/out", data=b"blob").status_code == 204
    resp = client.post(f"/v1/runs/{run_id}/steps/1/result", json={"node": "n1", "exit_code": 0})
    assert resp.status_code == 200, resp.get_json()

    assert client.get(f"/v1/runs/{run_id}/blob/out").get_data() == b"blob"
    assert client.get(f"/v1/runs/{run_id}/record").status_code == 200
    assert files_outside_records(area) == before
