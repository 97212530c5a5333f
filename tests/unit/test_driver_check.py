"""The start-up check of what the statement pipeline (app/store/pipeline.py) takes from psycopg and
SQLAlchemy below their public API (docs/deploy.md#1-install): None on the tested versions; a
release that moved one of those parts is named in one line, with the file of tested versions,
and the app is not built."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection

from app import create_app
from app.errors import RuntimeEnvironmentError
from app.store.pipeline import driver_problem


def test_the_installed_versions_have_what_the_pipeline_uses() -> None:
    assert driver_problem() is None


def test_a_psycopg_without_the_transaction_start_command_is_named(monkeypatch: Any) -> None:
    # Where psycopg defines it (its connections' common base), so no class inherits it.
    owner = next(c for c in psycopg.Connection.__mro__ if "_get_tx_start_command" in vars(c))
    monkeypatch.delattr(owner, "_get_tx_start_command")
    problem = driver_problem()
    assert problem is not None
    assert "psycopg.Connection._get_tx_start_command" in problem
    assert "constraints/runtime.txt" in problem
    with pytest.raises(RuntimeEnvironmentError, match="_get_tx_start_command"):
        create_app({"database.url": "postgresql://nobody@127.0.0.1:1/none"})


def test_a_sqlalchemy_whose_error_hook_changed_its_arguments_is_named(monkeypatch: Any) -> None:
    def handle(self: Any, error: Any, sql: Any) -> None:  # another signature
        raise AssertionError

    monkeypatch.setattr(Connection, "_handle_dbapi_exception", handle)
    problem = driver_problem()
    assert problem is not None and "_handle_dbapi_exception" in problem
