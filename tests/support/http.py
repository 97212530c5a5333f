"""An HTTP client of a live server shaped like Flask's test client, so that the helpers of
tests/support/agent.py and tests/support/scenes.py drive gunicorn (or nginx in front of it) as
they drive the test client."""

from __future__ import annotations

from typing import Any

import requests


class Http:
    """A client of ``base`` shaped like Flask's test client for the agent helpers of
    tests/support/agent.py (``post``/``put``/``get`` answering objects with ``status_code`` and
    ``get_json()``)."""

    def __init__(self, base: str, token: str | None, verify: str | bool = True) -> None:
        """``token`` None sends no Authorization header; ``verify`` is the certificate to trust
        over https (``requests``' own meaning)."""
        self.base = base
        self.verify = verify
        self.session = requests.Session()
        if token is not None:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def _call(self, method: str, path: str, **kwargs: Any) -> Answer:
        kwargs.setdefault("timeout", 60)
        # Per request: a Session's own `verify` loses to REQUESTS_CA_BUNDLE in the environment.
        kwargs.setdefault("verify", self.verify)
        return Answer(self.session.request(method, self.base + path, **kwargs))

    def post(self, path: str, json: Any = None, headers: dict[str, str] | None = None) -> Answer:
        return self._call("POST", path, json=json, headers=headers)

    def put(self, path: str, data: bytes = b"", headers: dict[str, str] | None = None) -> Answer:
        return self._call("PUT", path, data=data, headers=headers)

    def get(self, path: str, headers: dict[str, str] | None = None, **kwargs: Any) -> Answer:
        return self._call("GET", path, headers=headers, **kwargs)


class Answer:
    def __init__(self, resp: requests.Response) -> None:
        self.resp = resp
        self.status_code = resp.status_code
        self.headers = resp.headers
        self.content = resp.content
        self.text = resp.text

    def get_json(self) -> Any:
        return self.resp.json() if self.resp.content else None
