"""A failover under a storm, as docs/deploy.md#11-a-database-with-a-standby describes it: the
test's own primary and its synchronous streaming standby (never the machine's shared server),
``database.url`` naming both (the primary first, as an operator lists them), gunicorn with three
workers and ``mediator server reaper`` beside it, and node agents, a submitter and a canceller
that keep going through the switch. Mid-storm the primary dies (``kill -9`` of every process) or
hangs (SIGSTOP: its port completes handshakes and never answers), and the standby is promoted
after a lease window or within one. Afterwards what the clients were told is checked against what
the new primary holds: every acknowledged run, claim, result and cancel is there; no run ended
``lease expired`` and none failed but the cancelled ones; nothing is stranded; no 500, no 503 once
the new primary has taken writes a while, no request longer than the Mediator's own deadlines; no
deadlock. One scenario then brings the old primary back as a replica of the new one: every
connection still reaches the new primary and none stays on the replica.

Claims long-poll for 30 s and re-check only on a notification (``claim.recheck_seconds`` 3600):
a run placed after the switch is claimed at once only if every worker's listener moved to the
new primary (docs/deploy.md#11-a-database-with-a-standby, "During the switch")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dbfaults.failover import SWITCHES, describe, switch_under_storm, two_servers
from tests.dbfaults.replica import PrimaryAndStandby

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", list(SWITCHES))
def test_a_switch_under_a_storm_loses_nothing_acknowledged_and_strands_nothing(
    servers: PrimaryAndStandby, tmp_path: Path, name: str
) -> None:
    url = two_servers(servers)
    print(f"\n{name}: {describe(switch_under_storm(servers, url, tmp_path, SWITCHES[name]))}")
