"""PostgreSQL 14 is the minimum (the scan gate's ``idle_session_timeout``,
docs/design.md#the-scan-gate-and-wake-marks): an older server is named in the readiness problem, a
newer one is not."""

from __future__ import annotations

from app.migrate import server_problem


def test_a_server_older_than_14_is_a_problem_naming_both_versions():
    assert server_problem((13, 9)) == (
        "PostgreSQL 13.9 is too old: the Mediator needs PostgreSQL 14 or newer"
    )


def test_14_and_newer_are_fine():
    assert server_problem((14, 0)) is None
    assert server_problem((18, 1)) is None
    assert server_problem(None) is None
