"""The original fleet's two clients, request for request: the node agent's ``Client``
(internal/enode: advertise.go, claim.go, upload.go) and the submitter CLI's ``Client``
(internal/runctl/client.go). Each method builds its request as the Go code does — method, path,
query string, headers, body bytes, no body where Go sends none — and hands back the raw
``requests.Response``; tests decode it with :mod:`tests.compat.gowire` the way Go would.

Headers that differ between Go's net/http and python-requests and that no handler reads
(``Accept``, ``Connection``) are left to requests; ``User-Agent`` is Go's.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import requests

from tests.compat.gowire import go_marshal

GO_USER_AGENT = "Go-http-client/1.1"
TIMEOUT = 30


class _Wire:
    def __init__(self, base: str, token: str, principal: str) -> None:
        self.base = base
        self.token = token
        self.principal = principal
        self.http = requests.Session()
        # requests would add its own Accept; Go sends none besides Accept-Encoding.
        self.http.headers = {"User-Agent": GO_USER_AGENT, "Accept-Encoding": "gzip"}  # type: ignore[assignment]

    def close(self) -> None:
        self.http.close()

    def _send(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None
    ) -> requests.Response:
        return self.http.request(
            method, self.base + path, headers=headers, data=body, timeout=TIMEOUT
        )


class EnodeClient(_Wire):
    """internal/enode ``Client``: Base, Token, Principal, Instance."""

    def __init__(self, base: str, token: str, principal: str, instance: str = "") -> None:
        super().__init__(base, token, principal)
        self.instance = instance

    def _auth(self) -> dict[str, str]:
        return {"Authorization": "Bearer " + self.token, "X-Enode-Principal": self.principal}

    # advertise.go (Client.Advertise)
    def advertise(self, advert: dict[str, Any]) -> requests.Response:
        headers = {"Content-Type": "application/json", **self._auth()}
        return self._send("POST", "/v1/nodes", headers, go_marshal(advert))

    # claim.go (Client.Claim): no body, no query; the instance header only when set
    def claim(self, node_id: str) -> requests.Response:
        headers = self._auth()
        if self.instance:
            headers["X-Enode-Instance"] = self.instance
        return self._send("POST", f"/v1/nodes/{node_id}/claim", headers, None)

    # claim.go (Client.GetBlob)
    def get_blob(self, run_id: str, name: str) -> requests.Response:
        return self._send("GET", f"/v1/runs/{run_id}/blob/{name}", self._auth(), None)

    # claim.go (Client.Report): json.Marshal(Result)
    def report(self, run_id: str, seq: int, result: dict[str, Any]) -> requests.Response:
        headers = {"Content-Type": "application/json", **self._auth()}
        return self._send(
            "POST", f"/v1/runs/{run_id}/steps/{seq}/result", headers, go_marshal(result)
        )

    # claim.go (Client.Exited): json.Marshal(contract.Exited)
    def exited(self, run_id: str, seq: int, exited: dict[str, Any]) -> requests.Response:
        headers = {"Content-Type": "application/json", **self._auth()}
        return self._send(
            "POST", f"/v1/runs/{run_id}/steps/{seq}/exited", headers, go_marshal(exited)
        )

    # upload.go (Client.UploadLog): the step's final log, ?name=<step name>
    def upload_log(self, run_id: str, seq: int, name: str, body: bytes) -> requests.Response:
        headers = {"Content-Type": "text/plain; charset=utf-8", **self._auth()}
        return self._send("PUT", f"/v1/runs/{run_id}/steps/{seq}/log?name={name}", headers, body)

    # upload.go (Client.PutLogChunk): a progress chunk while the step runs
    def put_log_chunk(
        self, run_id: str, seq: int, name: str, attempt: int, body: bytes
    ) -> requests.Response:
        headers = {"Content-Type": "text/plain; charset=utf-8", **self._auth()}
        path = f"/v1/runs/{run_id}/steps/{seq}/log?name={name}&progress=1&attempt={attempt}"
        return self._send("PUT", path, headers, body)

    # upload.go (Client.PutBlob): octet-stream, Content-Length = size, http.NoBody when empty
    def put_blob(self, run_id: str, seq: int, name: str, body: bytes) -> requests.Response:
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(len(body)),
            **self._auth(),
        }
        return self._send("PUT", f"/v1/runs/{run_id}/steps/{seq}/blob/{name}", headers, body)


class RunctlClient(_Wire):
    """internal/runctl ``Client``: Base, Token, Principal; every call goes through ``do``."""

    def _do(self, method: str, path: str, body: bytes | None) -> requests.Response:
        headers: dict[str, str] = {}
        if body is not None:
            headers["Content-Type"] = "application/json"
        headers["Authorization"] = "Bearer " + self.token
        headers["X-Enode-Principal"] = self.principal
        return self._send(method, path, headers, body)

    # Client.Submit: the contract file's bytes as they are
    def submit(self, contract: bytes, dry: bool = False) -> requests.Response:
        return self._do("POST", "/v1/runs/dry-run" if dry else "/v1/runs", contract)

    # Client.Status
    def status(self, run_id: str) -> requests.Response:
        return self._do("GET", "/v1/runs/" + run_id, None)

    # Client.Cancel: POST with no body
    def cancel(self, run_id: str) -> requests.Response:
        return self._do("POST", "/v1/runs/" + run_id + "/cancel", None)

    # Client.Record
    def record(self, run_id: str) -> requests.Response:
        return self._do("GET", "/v1/runs/" + run_id + "/record", None)

    # Client.Capabilities
    def capabilities(self) -> requests.Response:
        return self._do("GET", "/v1/capabilities", None)

    # Client.Nodes
    def nodes(self) -> requests.Response:
        return self._do("GET", "/v1/nodes", None)

    # Client.Runs with RunsQuery.query(): only the set fields, url.Values.Encode (sorted keys),
    # no "?" at all when nothing is set
    def runs(
        self, state: str = "", since: str = "", work: str = "", limit: int = 0
    ) -> requests.Response:
        values = {}
        if state:
            values["state"] = state
        if since:
            values["since"] = since
        if work:
            values["work"] = work
        if limit:
            values["limit"] = str(limit)
        query = "?" + urlencode(sorted(values.items())) if values else ""
        return self._do("GET", "/v1/runs" + query, None)

    # Client.Asks
    def asks(self) -> requests.Response:
        return self._do("GET", "/v1/asks", None)

    # Client.Answer, with the body cmd/runctl builds: json.Marshal(map[string]any) (sorted keys)
    def answer(self, run_id: str, seq: int, answer: dict[str, Any]) -> requests.Response:
        body = go_marshal(dict(sorted(answer.items())))
        return self._do("POST", f"/v1/runs/{run_id}/steps/{seq}/answer", body)

    # Client.StepLog as the original's log viewer reads a step's log: ?name=<step id>
    def step_log(self, run_id: str, seq: int, name: str, offset: int = 0) -> requests.Response:
        return self._do("GET", f"/v1/runs/{run_id}/steps/{seq}/log?name={name}&from={offset}", None)

    # The ledger as the original fleet's clients read it (GET …/ledger, {"entries": [...]})
    def ledger(self, run_id: str) -> requests.Response:
        return self._do("GET", f"/v1/runs/{run_id}/ledger", None)
