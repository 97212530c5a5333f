"""The switch to a standby (docs/deploy.md#what-a-switch-costs), as a line of the benchmark.

The scenario is the failover test's own (``tests/dbfaults/failover.py``, imported, not
restated): a primary and its synchronous streaming standby of this run's own (never the
machine's shared server), gunicorn with three workers and a reaper on the two-host URL, agents,
a submitter and a canceller; the primary killed (``kill -9``) and the standby promoted a little
more than a lease window later; then the old primary brought back as a replica of the new one.
Every check of the test holds or the line fails. It reports the seconds from the kill to the
first 201 on the new primary and the 503s answered meanwhile; then the statements of a placed
submit and of its cancel after the switch, on the two-host URL (the old primary, now a replica,
still listed first) and on the new primary alone: a switch adds none.
"""

from __future__ import annotations

from typing import Any

from bench.phases import Bench, say, statement_counts


def switch(b: Bench) -> dict[str, Any]:
    from tests.dbfaults.failover import (
        DBNAME,
        SWITCHES,
        describe,
        switch_under_storm,
        two_servers,
    )
    from tests.dbfaults.replica import PrimaryAndStandby

    work = b.workdir / "switch"
    work.mkdir(parents=True, exist_ok=True)
    name = "kill-after-a-lease-window-then-rejoin"
    pair = PrimaryAndStandby().start()
    try:
        url = two_servers(pair)
        figures = switch_under_storm(pair, url, work, SWITCHES[name])
        say(f"switch: {describe(figures)}")
        two_hosts = statement_counts(url, work, "switch-board", advertise=True, prefix="sw2")
        one_host = statement_counts(pair.standby_url(DBNAME), work, "switch-board", prefix="sw1")
    finally:
        pair.close()
    say(
        f"  statements after the switch: two-host URL {two_hosts}, the new primary alone {one_host}"
    )
    return {
        "switch": {
            **figures,
            "scenario": name,
            "statements_two_hosts": two_hosts,
            "statements_one_host": one_host,
        }
    }
