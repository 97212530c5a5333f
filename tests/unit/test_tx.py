"""The retry of a service function's transaction (docs/queue.md#lock-order): a deadlock or a
serialisation failure (SQLSTATE 40P01, 40001) is retried, up to 3 times, by the function that owns
the transaction; anything else is raised at once; what a failed attempt left for after commit is
forgotten before the next attempt.

These test the decorator's control flow with plain functions that raise the error SQLAlchemy
raises (``DBAPIError`` wrapping a real psycopg error carrying its SQLSTATE); no database is used.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import psycopg.errors
import pytest
from sqlalchemy.exc import DBAPIError

from app.services.notify import AfterCommit
from app.services.tx import retrying

RETRIED = [psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure]


def db_error(cls: type[psycopg.Error]) -> DBAPIError:
    """What SQLAlchemy raises when PostgreSQL answers with ``cls``'s SQLSTATE."""
    return DBAPIError("UPDATE runs SET state = %(state)s", {"state": "RUNNING"}, cls("boom"))


def failing(times: int, cls: type[psycopg.Error], result: Any = "committed") -> Callable[..., Any]:
    """A transaction that fails ``times`` times with ``cls``, then returns ``result``; its calls
    are counted in ``.calls``."""

    def fn(*args: Any, **kwargs: Any) -> Any:
        fn.calls += 1  # type: ignore[attr-defined]
        if fn.calls <= times:  # type: ignore[attr-defined]
            raise db_error(cls)
        return result

    fn.calls = 0  # type: ignore[attr-defined]
    return fn


def fields(after: AfterCommit) -> dict[str, Any]:
    return copy.deepcopy(vars(after))


def record_everything(after: AfterCommit, tag: str) -> None:
    """What one attempt of a transaction leaves for after commit, in every field."""
    after.claim_nodes.add(f"node-{tag}")
    after.asks.append({"event": "ask", "run_id": f"run-{tag}", "seq": 1})
    after.wake(f"released by run-{tag}/node-{tag}")
    after.wake_anyway = f"result of run-{tag}#01"
    after.verifying.append(f"run-{tag}")
    after.settled.append(f"run-{tag}")


def an_after_commit_with_something_recorded() -> AfterCommit:
    after = AfterCommit()
    after.claim_nodes.add("node-before")
    after.wake("cause before the call")
    after.settled.append("run-before")
    return after


# ---------------------------------------------------------------- what is retried


@pytest.mark.parametrize("cls", RETRIED, ids=lambda c: c.sqlstate)
def test_a_deadlock_or_serialisation_failure_is_retried_and_the_retry_succeeds(cls):
    fn = failing(2, cls)

    result = retrying(fn)()

    assert result == "committed"
    assert fn.calls == 3


@pytest.mark.parametrize("cls", RETRIED, ids=lambda c: c.sqlstate)
def test_the_retry_gives_up_after_3_retries_and_re_raises_the_error(cls):
    fn = failing(100, cls)

    with pytest.raises(DBAPIError) as raised:
        retrying(fn)()

    assert fn.calls == 4  # the first attempt and 3 retries
    assert isinstance(raised.value.orig, cls)


@pytest.mark.parametrize("cls", RETRIED, ids=lambda c: c.sqlstate)
def test_a_transaction_that_fails_3_times_succeeds_on_its_last_retry(cls):
    fn = failing(3, cls)

    assert retrying(fn)() == "committed"
    assert fn.calls == 4


@pytest.mark.parametrize(
    "cls",
    [
        psycopg.errors.UniqueViolation,
        psycopg.errors.ForeignKeyViolation,
        psycopg.errors.QueryCanceled,
        psycopg.errors.LockNotAvailable,
    ],
    ids=lambda c: c.sqlstate,
)
def test_an_error_of_another_sqlstate_is_not_retried(cls):
    fn = failing(1, cls)

    with pytest.raises(DBAPIError) as raised:
        retrying(fn)()

    assert fn.calls == 1
    assert isinstance(raised.value.orig, cls)


def test_an_error_that_is_not_a_database_error_is_not_retried():
    calls = []

    def fn() -> None:
        calls.append(1)
        raise ValueError("a bug, not a conflict")

    with pytest.raises(ValueError, match="a bug, not a conflict"):
        retrying(fn)()

    assert len(calls) == 1


def test_the_function_gets_the_same_arguments_on_every_attempt():
    seen = []

    @retrying
    def fn(a: Any, *, b: Any) -> tuple[Any, Any]:
        seen.append((a, b))
        if len(seen) < 3:
            raise db_error(psycopg.errors.DeadlockDetected)
        return a, b

    marker = object()

    assert fn(marker, b="run-1") == (marker, "run-1")
    assert seen == [(marker, "run-1")] * 3


# ---------------------------------------------------------------- AfterCommit across attempts


@pytest.mark.parametrize("cls", RETRIED, ids=lambda c: c.sqlstate)
def test_a_retry_starts_from_the_after_commit_state_at_the_call(cls):
    after = an_after_commit_with_something_recorded()
    at_call = fields(after)
    seen_at_start: list[dict[str, Any]] = []

    @retrying
    def transaction(after: AfterCommit) -> str:
        seen_at_start.append(fields(after))
        record_everything(after, f"attempt-{len(seen_at_start)}")
        if len(seen_at_start) == 1:
            raise db_error(cls)
        return "committed"

    assert transaction(after) == "committed"

    assert seen_at_start == [at_call, at_call]
    # What is left to do after commit is the call-time state plus the attempt that committed.
    expected = an_after_commit_with_something_recorded()
    record_everything(expected, "attempt-2")
    assert fields(after) == fields(expected)


def test_an_after_commit_passed_by_keyword_is_restored_before_the_retry_too():
    after = an_after_commit_with_something_recorded()
    at_call = fields(after)
    seen_at_start: list[dict[str, Any]] = []

    @retrying
    def transaction(run_id: str, *, after: AfterCommit) -> str:
        seen_at_start.append(fields(after))
        record_everything(after, f"attempt-{len(seen_at_start)}")
        if len(seen_at_start) < 3:
            raise db_error(psycopg.errors.DeadlockDetected)
        return run_id

    assert transaction("run-1", after=after) == "run-1"

    assert seen_at_start == [at_call] * 3


def test_the_caller_keeps_its_own_after_commit_object_across_retries():
    # The caller runs the after-commit work from the object it passed in: the retry must restore
    # that object, not hand the next attempt a copy the caller never sees.
    after = AfterCommit()
    seen: list[AfterCommit] = []

    @retrying
    def transaction(after: AfterCommit) -> None:
        seen.append(after)
        after.claim_nodes.add("n1")
        if len(seen) == 1:
            raise db_error(psycopg.errors.SerializationFailure)

    transaction(after)

    assert all(a is after for a in seen) and len(seen) == 2
    assert after.claim_nodes == {"n1"}


@pytest.mark.parametrize(
    "times, cls",
    [(100, psycopg.errors.DeadlockDetected), (1, psycopg.errors.UniqueViolation)],
    ids=["gave-up", "not-retried"],
)
def test_a_transaction_that_finally_fails_leaves_nothing_of_its_attempts_for_after_commit(
    times, cls
):
    # Nothing committed, so nothing may be notified, woken, sealed or announced for it.
    after = an_after_commit_with_something_recorded()
    at_call = fields(after)
    calls = []

    @retrying
    def transaction(after: AfterCommit) -> None:
        calls.append(1)
        record_everything(after, f"attempt-{len(calls)}")
        if len(calls) <= times:
            raise db_error(cls)

    with pytest.raises(DBAPIError):
        transaction(after)

    assert fields(after) == at_call
