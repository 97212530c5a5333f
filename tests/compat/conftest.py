"""One real gunicorn for the whole compatibility suite, on a database of its own cloned from the
migrated template; every test starts from empty tables and an empty Record store.

Starting gunicorn per test would cost seconds each; the Mediator keeps nothing in its processes
that correctness needs (docs/scaling.md#what-must-be-shared), so emptying the tables between tests
is a clean start. The long-poll window is 1 s: the original agent's claim carries no ``?wait=``, so
every claim that finds nothing waits the configured window.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from app.dev.embedded import create_database, drop_database
from tests.compat.clients import EnodeClient, RunctlClient
from tests.compat.mediator import LONG_POLL_SECONDS, SUBMITTER, Mediator
from tests.support.apps import TOKEN, gunicorn_on

NODE_OWNER = "owner@lab.test"


@pytest.fixture(scope="package")
def mediator_server(
    pg_admin_url: str, template_db: tuple[str, str], tmp_path_factory: Any
) -> Iterator[Mediator]:
    name = f"{template_db[0]}_compat_{uuid.uuid4().hex[:6]}"
    url = create_database(pg_admin_url, name, template=template_db[0])
    try:
        with gunicorn_on(
            url,
            tmp_path_factory.mktemp("compat"),
            MEDIATOR_CLAIM_LONG_POLL_SECONDS=str(LONG_POLL_SECONDS),
            MEDIATOR_CLAIM_RECHECK_SECONDS="1",
        ) as server:
            yield Mediator(server, url)
    finally:
        drop_database(pg_admin_url, name)


@pytest.fixture
def mediator(mediator_server: Mediator) -> Mediator:
    """The shared server, emptied: no nodes, runs or Records left by an earlier test."""
    mediator_server.empty()
    return mediator_server


@pytest.fixture
def enode(mediator: Mediator) -> Iterator[EnodeClient]:
    """The agent of node ``n1`` (one process lifetime: instance ``life-1``)."""
    client = EnodeClient(mediator.url, TOKEN, NODE_OWNER, instance="life-1")
    yield client
    client.close()


@pytest.fixture
def runctl(mediator: Mediator) -> Iterator[RunctlClient]:
    client = RunctlClient(mediator.url, TOKEN, SUBMITTER)
    yield client
    client.close()
