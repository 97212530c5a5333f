"""What the teams' view counts, by the team stored on each run (docs/teams.md)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.models import Lease, Run
from app.states import QUEUED, RUNNING


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
