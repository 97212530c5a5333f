"""A person using the pages (docs/pages.md#signing-in) without a browser: signs in, reads pages,
sends their forms with the CSRF token the page carries — over Flask's test client or HTTP to a live
server."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import requests
from flask import Flask

_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    """The CSRF token a page's forms carry."""
    found = _CSRF.search(html)
    assert found, "the page has no form with a CSRF token"
    return unescape(found.group(1))


class PageUser:
    """One browser's cookies. ``backend``: a Flask app (its test client) or a live server's URL."""

    def __init__(self, backend: Flask | str) -> None:
        if isinstance(backend, str):
            self._http: requests.Session | None = requests.Session()
            self._base = backend
            self._client: Any = None
        else:
            self._http = None
            self._base = ""
            self._client = backend.test_client()

    def get(self, path: str, **headers: str) -> Any:
        """GET without following a redirect; the reply has ``status_code``, ``headers``, ``text``."""
        if self._http is not None:
            resp = self._http.get(
                self._base + path, headers=headers, allow_redirects=False, timeout=30
            )
            return resp
        resp = self._client.get(path, headers=headers)
        resp.text = resp.get_data(as_text=True)
        return resp

    def post(self, path: str, data: dict[str, str], **headers: str) -> Any:
        """POST a form as given (a forged one has no ``csrf_token``)."""
        if self._http is not None:
            return self._http.post(
                self._base + path, data=data, headers=headers, allow_redirects=False, timeout=30
            )
        resp = self._client.post(path, data=data, headers=headers)
        resp.text = resp.get_data(as_text=True)
        return resp

    def page(self, path: str) -> str:
        resp = self.get(path)
        assert resp.status_code == 200, (path, resp.status_code, resp.text[:500])
        return resp.text

    def send_form(self, page: str, action: str, data: dict[str, str]) -> Any:
        """Send a form of ``page`` (a path) to ``action`` with the CSRF token that page carries."""
        return self.post(action, {"csrf_token": csrf_of(self.page(page)), **data})

    def sign_in(self, token: str, principal: str | None = None, next_path: str = "/") -> Any:
        data = {"token": token, "next": next_path}
        if principal is not None:
            data["principal"] = principal
        resp = self.send_form("/signin", "/signin", data)
        return resp

    def signed_in(self, token: str, principal: str | None = None) -> PageUser:
        resp = self.sign_in(token, principal)
        assert resp.status_code == 303, (resp.status_code, resp.text[:500])
        return self

    def sign_out(self) -> Any:
        return self.send_form("/runs", "/signout", {})

    def cookie(self, name: str) -> str | None:
        if self._http is not None:
            return self._http.cookies.get(name)
        found = self._client.get_cookie(name)
        return found.value if found is not None else None
