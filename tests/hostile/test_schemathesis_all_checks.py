"""Schemathesis with every check against the document a live gunicorn serves at
``/v1/openapi.json`` (route 21): the document says what the Mediator does. For every operation,
requests generated from the document — its examples, the coverage of each parameter's edges and
random ones, valid and invalid — are sent with a valid token to a server with a node and a
running run; every response must match its documented status, content type, headers and body;
valid requests must be taken and invalid ones refused; a request without the token or with a
wrong one must be 401; undocumented methods must be 405 with ``Allow``. Any failed check fails
the test.

What a valid request may still be refused for is configured per operation, and only what the
document itself says: a contract that breaks a rule between its steps and roles (400, which JSON
Schema cannot state) or that no node of the fleet can fill (422); a log or blob of a run that has
finished (410); an answer its ask's schema refuses (422). The rest are the check's own defaults.

Bounded by what it does, never by the clock: a fixed seed, ``PER_OPERATION`` random requests per
operation in the fuzzing phase, the stateful phase at most ``STATEFUL_STEPS`` steps, and the
coverage phase (every boundary case of every parameter) with the contract bodies of ``POST
/v1/runs`` and ``POST /v1/runs/dry-run`` covered by their valid boundary cases only (about 740
each): generating the ~900 invalid ones of that large schema cost schemathesis 65 s of CPU, the
whole test's time on a busy machine. Invalid contracts are drawn by the fuzzing phase here and by
tests/hostile/test_schemathesis.py, tests/hostile/test_bodies.py and the contract's unit tests.
``HYPOTHESIS_PROFILE=long`` covers the invalid boundary cases too and draws twenty times as many
requests.

Measured on this project's 2-core CI machine (local PostgreSQL 15, gunicorn with one worker), the
phases on a quiet machine: examples 1 s, coverage 8 s, fuzzing 10 s, stateful 8 s (about 30 s in
all, 108 s before the bound); the timeout below is ten times that.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, StopReason, events

from tests.support.apps import TOKEN, LiveServer
from tests.support.strategies import hypothesis_profile

LONG = hypothesis_profile() == "long"
PER_OPERATION = 300 if LONG else 15
STATEFUL_STEPS = 100 if LONG else 10
live_env = {"MEDIATOR_CLAIM_LONG_POLL_SECONDS": "0.2"}

DEFAULT_ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429"]
CONFIG = f"""
workers = 1
seed = 4711
headers = {{ Authorization = "Bearer {TOKEN}" }}
generation.max-examples = {PER_OPERATION}
phases.stateful.max-steps = {STATEFUL_STEPS}

[[operations]]
include-name-regex = "^POST /v1/runs(/dry-run)?$"
checks.positive_data_acceptance.expected-statuses = {DEFAULT_ACCEPTED + ["400", "422"]}

[[operations]]
include-name-regex = "^PUT /v1/runs/.*/(log|blob/[{{]name[}}])$"
checks.positive_data_acceptance.expected-statuses = {DEFAULT_ACCEPTED + ["410"]}

[[operations]]
include-name-regex = "^POST /v1/runs/.*/answer$"
checks.positive_data_acceptance.expected-statuses = {DEFAULT_ACCEPTED + ["422"]}
"""
if not LONG:  # only the valid boundary cases of the contract body (see above)
    CONFIG += """
[[operations]]
include-name-regex = "^POST /v1/runs(/dry-run)?$"
phases.coverage.generation.mode = "positive"
"""

# The cursor of GET /v1/runs?before=: an RFC 3339 time, a comma and a run_id.
schemathesis.openapi.format(
    "run-cursor",
    st.builds(
        lambda at, run_id: f"{at.isoformat()},{run_id}",
        st.datetimes(timezones=st.just(UTC)),
        st.from_regex(r"\A[A-Za-z0-9._:@-]{1,40}\Z"),
    ),
)

# The document's own examples name these: the examples meet rows that exist.
EXAMPLE_RUN = {
    "run_id": "kernel-4711-boot",
    "requires": [{"as": "dut", "capability": "board", "soc": "imx8mp"}],
    "steps": [{"id": "boot", "uses": "dut", "run": ["boot-test"], "out": ["result.json"]}],
    "success_when": [{"step": "boot", "exit_code": 0, "produced": ["result.json"]}],
}


@pytest.fixture(scope="module")
def live_schema(live: LiveServer) -> Any:
    """The document as the live server serves it, on a fleet with a node whose step is claimed
    and has a log and an artifact."""
    advert = {
        "node_id": "board-1",
        "instance": "boot-1",
        "capabilities": [{"capability": "board", "attrs": {"soc": "imx8mp"}}],
    }
    assert live.post("/v1/nodes", advert).status_code == 200
    assert live.post("/v1/runs", EXAMPLE_RUN).status_code == 201
    claim = live.post("/v1/nodes/board-1/claim", headers={"X-Enode-Instance": "boot-1"})
    assert claim.status_code == 200 and claim.json()["seq"] == 1
    base = f"{live.url}/v1/runs/kernel-4711-boot/steps/1"
    for path, data in (("/log", b"booted\n"), ("/blob/result.json", b'{"ok": true}')):
        resp = requests.put(base + path, data=data, headers=live.headers(), timeout=30)
        assert resp.status_code in (200, 204), resp.text
    return schemathesis.openapi.from_url(
        f"{live.url}/v1/openapi.json", config=SchemathesisConfig.from_str(CONFIG)
    )


def _failure_text(label: str, check: Any) -> str:
    info = check.failure_info
    failure = info.failure
    return f"{label}: {check.name}: {failure.title}\n{failure.message}\n{info.code_sample}"


@pytest.mark.timeout(300)  # ten times the 30 s it takes on a quiet 2-core machine
def test_every_operation_does_what_the_document_says(live_schema: Any) -> None:
    failures: list[str] = []
    errors: list[str] = []
    tested: set[str] = set()
    finished = None
    started: dict[str, float] = {}
    for event in schemathesis.engine.from_schema(live_schema).execute():
        if isinstance(event, events.PhaseStarted):
            started[event.phase.name.value] = event.timestamp
        elif isinstance(event, events.PhaseFinished):
            name = event.phase.name.value
            print(f"phase {name}: {event.timestamp - started.get(name, event.timestamp):.1f} s")
        if isinstance(event, (events.ScenarioFinished, events.FuzzScenarioFinished)):
            recorder = event.recorder
            tested.add(recorder.label)
            for checks in recorder.checks.values():
                failures.extend(
                    _failure_text(recorder.label, c) for c in checks if c.status == Status.FAILURE
                )
        elif isinstance(event, events.NonFatalError):
            errors.append(f"{event.label}: {event.info.title}: {event.info.message}")
        elif isinstance(event, events.FatalError):
            errors.append(f"fatal: {event.exception!r}")
        elif isinstance(event, events.EngineFinished):
            finished = event
            failures.extend(f"after run: {f.title}\n{f.message}" for f in event.failures)
    assert finished is not None and finished.stop_reason == StopReason.COMPLETED
    assert errors == [] and failures == [], "\n\n".join(errors + sorted(set(failures)))
    assert len({label for label in tested if " /" in label}) == 29, sorted(
        tested
    )  # /metrics is documented too, and GET /v1/teams and GET /v1/teams/usage
