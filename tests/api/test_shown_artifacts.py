"""The asks inbox reads at most the first 32 KiB of each artifact it shows
(docs/api.md#get-v1asks--the-open-asks, docs/compatibility.md#differences-from-the-original-server,
docs/security.md#input-and-load): a larger one goes as a string cut there, with ``truncated: true``,
and the rest of the file is never read, whatever its size.

The artifact's file is replaced by a named pipe fed by a thread of the test: what the inbox reads
is exactly what the thread could write before the reader hung up."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from tests.support.actors import cap
from tests.support.agent import advertise, claimed, report
from tests.support.contracts import contract, role
from tests.support.submitter import submit

SHOWN = 32 * 1024
FED = 4 * 1024 * 1024  # what the pipe offers, far past what the inbox may read
PIPE_SLACK = 1024 * 1024  # a pipe's buffer (64 KiB by default, at most 1 MiB by default)


class Feeder(threading.Thread):
    """Writes ``FED`` bytes of lines into the named pipe ``path``, 4 KiB at a time, until they
    are all written or the reader hangs up; ``written`` is how many it got rid of."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.written = 0
        self.line = b"boot line 0123456789 abcdefghij\n" * 128  # 4 KiB

    def run(self) -> None:
        with open(self.path, "wb", buffering=0) as pipe:
            while self.written < FED:
                try:
                    self.written += pipe.write(self.line)
                except BrokenPipeError:
                    return

    def release(self) -> None:
        """Lets a feeder still waiting for a reader go (a reader that never came)."""
        with contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            os.close(fd)


def asking_to_see_the_boot_log(client: Any) -> None:
    advertise(client, "n1", cap("board"))
    steps = [
        {"id": "boot", "uses": "dut", "run": ["boot-test"], "out": ["boot.log"]},
        {
            "id": "sign-off",
            "ask": {"prompt": "Boot log looks right?", "show": ["boot.log"]},
            "out": ["decision"],
        },
    ]
    submit(client, contract("r1", role("dut"), steps=steps), 201)
    claimed(client, "n1")
    assert client.put("/v1/runs/r1/steps/1/blob/boot.log", data=b"x\n").status_code == 204
    assert report(client, "r1", 1, "n1", produced=["boot.log"]).status_code == 200


def test_the_inbox_reads_no_more_than_the_first_32_kib_of_a_shown_artifact(client, ctx):
    asking_to_see_the_boot_log(client)
    path = ctx.records.path("r1") / "blobs" / "01.0-boot.log"
    path.unlink()
    os.mkfifo(path)
    feeder = Feeder(str(path))
    feeder.start()
    try:
        resp = client.get("/v1/asks")
    finally:
        feeder.release()
        feeder.join(30)

    assert resp.status_code == 200, resp.get_json()
    [ask] = resp.get_json()["asks"]
    [shown] = ask["shown"]
    assert shown == {
        "name": "boot.log",
        "content": (feeder.line * 8)[:SHOWN].decode(),
        "truncated": True,
    }
    assert not feeder.is_alive()
    assert feeder.written <= SHOWN + PIPE_SLACK < FED
