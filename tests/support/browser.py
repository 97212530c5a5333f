"""A person in a real browser: Debian's chromium, headless, driven by selenium through Debian's
chromedriver (never a driver or browser fetched at run time). Finds elements by the hooks
docs/pages.md#asks-asks names (``data-ask``, input names, labels); waits for what a page shows,
never for a time."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.expected_conditions import staleness_of
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.apps import ROOT
from tests.support.programs import require_program

WINDOW = (1200, 1000)
WAIT_SECONDS = 60  # a safety net: every wait ends as soon as the page shows what it waits for
SHOTS = ROOT / "tests" / "artifacts" / "pages"
DOC_SHOTS = ROOT / "docs" / "pages"  # written when MEDIATOR_UPDATE_SCREENSHOTS=1


def spki_sha256(cert: Path) -> str:
    """The base64 SHA-256 of the public key (SubjectPublicKeyInfo) of the PEM certificate
    ``cert``: what chromium's ``--ignore-certificate-errors-spki-list`` takes."""
    openssl = require_program("openssl", "openssl")
    done = subprocess.run(
        [openssl, "x509", "-in", str(cert), "-pubkey", "-noout"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    # The PEM public key is the DER SubjectPublicKeyInfo in base64 between its two armour lines.
    der = base64.b64decode(
        "".join(line for line in done.stdout.splitlines() if "-----" not in line)
    )
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


@contextmanager
def chromium(profile: Path, trust: Path | None = None) -> Iterator[webdriver.Chrome]:
    """Headless chromium with its own profile. ``trust``: a self-signed certificate (a test's
    nginx) accepted by its key alone, as if a CA had signed it; any other bad certificate is
    still refused (never ``--ignore-certificate-errors``)."""
    binary = require_program("chromium", "chromium")
    driver_binary = require_program("chromedriver", "chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(flag)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # chromium refuses to run as root inside its sandbox
    if trust is not None:
        # Honoured only with a --user-data-dir of its own, which every browser here has.
        options.add_argument(f"--ignore-certificate-errors-spki-list={spki_sha256(trust)}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_binary))
    try:
        yield driver
    finally:
        driver.quit()


class BrowserUser:
    """One person at one browser, on the pages of the server at ``base``."""

    def __init__(self, driver: webdriver.Chrome, base: str) -> None:
        self.driver = driver
        self.base = base

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def until(self, what: Callable[[], Any], message: str) -> Any:
        """Wait until ``what()`` is true (the page's live parts refresh themselves)."""
        # A live part replaced under the lookup is looked up again on the next try.
        ignored = (StaleElementReferenceException, NoSuchElementException)
        wait = WebDriverWait(self.driver, WAIT_SECONDS, ignored_exceptions=ignored)
        return wait.until(lambda _: what(), message)

    def text(self) -> str:
        return self.find("body").text

    def send(self, css: str) -> None:
        """Click the button ``css`` that sends a form, and wait for the page that answers it."""
        leaving = self.find("html")
        self.find(css).click()
        self.until(lambda: staleness_of(leaving)(self.driver), f"the answer to {css}")

    def sign_in(self, token: str, principal: str | None = None) -> None:
        """Sign in through the form (from any page that sent us to it, or the sign-in itself)."""
        if "/signin" not in self.driver.current_url:
            self.open("/signin")
        self.driver.find_element(By.NAME, "token").send_keys(token)
        if principal:
            self.driver.find_element(By.NAME, "principal").send_keys(principal)
        self.send("#sign-in")
        assert "/signin" not in self.driver.current_url, self.text()[:500]
        assert "Signed in as" in self.find("#signed-in").text

    def sign_out(self) -> None:
        self.send("#sign-out")
        assert "/signin" in self.driver.current_url, self.text()[:500]

    def ask_form(self, run_id: str, seq: int) -> WebElement:
        return self.find(f'form[data-ask="{run_id}/{seq}"]')

    def answer_with_button(self, run_id: str, seq: int, name: str, value: str) -> None:
        form = self.ask_form(run_id, seq)
        form.find_element(By.CSS_SELECTOR, f'button[name="{name}"][value="{value}"]').click()

    def screenshot(self, name: str) -> Path:
        """The page as it is now, under tests/artifacts/pages (and docs/pages when asked)."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        shot = SHOTS / f"{name}.png"
        assert self.driver.save_screenshot(str(shot)), shot
        if os.environ.get("MEDIATOR_UPDATE_SCREENSHOTS") == "1":
            DOC_SHOTS.mkdir(parents=True, exist_ok=True)
            (DOC_SHOTS / f"{name}.png").write_bytes(shot.read_bytes())
        return shot
