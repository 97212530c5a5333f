"""The browser of the pages' tests in chromium: one a module, each test's person signed out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import BrowserUser, chromium


@pytest.fixture(scope="module")
def driver(tmp_path_factory: Any) -> Iterator[Any]:
    with chromium(tmp_path_factory.mktemp("chromium")) as d:
        yield d


@pytest.fixture
def person(driver: Any, live_server: Any) -> Iterator[BrowserUser]:
    driver.delete_all_cookies()  # each test's person starts signed out
    yield BrowserUser(driver, live_server.url)
    driver.delete_all_cookies()
