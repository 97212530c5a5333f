"""What the teams' view counts, by the team stored on each run (docs/teams.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, func, select, text
from sqlalchemy.orm import Session

from app.models import Lease, Run
from app.states import QUEUED, RUNNING
from app.store.driver import fetch


@dataclass(frozen=True)
class TeamCounts:
    queued: int = 0  # QUEUED runs
    running: int = 0  # RUNNING runs
    nodes: int = 0  # leases held by its runs


def team_counts(s: Session) -> dict[str, TeamCounts]:
    """Per stored team name: its QUEUED and RUNNING runs and the leases its runs hold. Two
    statements, over the runs in those states (``ix_runs_state_created``) and the leases: the
    count grows with what is alive now, not with history."""
    runs = s.execute(
        select(
            Run.team,
            func.count().filter(Run.state == QUEUED),
            func.count().filter(Run.state == RUNNING),
        )
        .where(Run.state.in_((QUEUED, RUNNING)))
        .group_by(Run.team)
    ).all()
    held = s.execute(
        select(Run.team, func.count())
        .select_from(Lease)
        .join(Run, Run.run_id == Lease.run_id)
        .group_by(Run.team)
    ).all()
    leases: dict[str, int] = {team: n for team, n in held}
    out = {team: TeamCounts(queued, running, leases.get(team, 0)) for team, queued, running in runs}
    for team, nodes in leases.items():
        out.setdefault(team, TeamCounts(nodes=nodes))
    return out


# One configured team's QUEUED runs, up to :m, by ``ix_runs_queued_team``.
_QUEUED_OF_TEAM = text(
    "SELECT count(*) FROM (SELECT 1 FROM runs WHERE state = 'QUEUED' AND team = :team LIMIT :m) q"
)
# ``default``'s QUEUED runs, up to :m: those stored under a name that is not in :apart (the other
# configured teams and ``health``). The queue's stored names are found one index probe each (a
# loose index scan of ``ix_runs_queued_team``), then each kept name's runs are read up to :m:
# the read grows with the names in the queue and with :m, never with other teams' runs.
_QUEUED_OF_DEFAULT = text(
    "WITH RECURSIVE names(team) AS ("
    " (SELECT team FROM runs WHERE state = 'QUEUED' ORDER BY team LIMIT 1)"
    " UNION ALL"
    " SELECT (SELECT r.team FROM runs r WHERE r.state = 'QUEUED' AND r.team > names.team"
    " ORDER BY r.team LIMIT 1)"
    " FROM names WHERE names.team IS NOT NULL)"
    " SELECT count(*) FROM (SELECT 1 FROM names CROSS JOIN LATERAL"
    " (SELECT 1 FROM runs WHERE state = 'QUEUED' AND team = names.team LIMIT :m) one"
    " WHERE names.team IS NOT NULL AND names.team <> ALL(CAST(:apart AS text[]))"
    " LIMIT :m) q"
)


def queued_up_to(
    s: Session | Connection, team: str, *, apart: Sequence[str] | None, limit: int
) -> int:
    """The QUEUED runs counted as ``team``'s, at most ``limit`` of them, in the caller's
    transaction (a run it inserted counts). ``apart``: None for a configured team other than
    ``default`` (its stored name alone); for ``default``, the names whose runs are not its own
    (every other configured team and ``health``): a name no longer configured counts as
    ``default`` (docs/teams.md, "A team removed")."""
    if apart is None:
        ((n,),) = fetch(s, _QUEUED_OF_TEAM, {"team": team, "m": limit})
    else:
        ((n,),) = fetch(s, _QUEUED_OF_DEFAULT, {"apart": list(apart), "m": limit})
    return int(n)
