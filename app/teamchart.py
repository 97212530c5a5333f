"""The teams' usage over the last day (docs/teams.md, "Where the team shows"): the answer of
``GET /v1/teams/usage`` laid out as 24 hourly cells per team, for ``mediator teams``'s sparklines
and the ``/teams`` page's stacked bars. Pure; the page draws the bars as SVG from these numbers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from app.wire import parse_ts, ts

HOURS = 24  # the hours GET /v1/teams/usage covers, the current one last
WIDTH, HEIGHT = 480, 120  # the chart's size in pixels (and SVG user units)
PLOT = 100  # units from the top to the bars' baseline; the hours' labels are below it
HEADROOM = 4  # units kept free above the tallest stack
COLUMN = WIDTH / HOURS
BAR = COLUMN - 4
# One colour per team by its index in the sorted team list (GET /v1/teams is by name), so a team
# keeps its colour from one look to the next while the configured teams stay the same.
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)


@dataclass(frozen=True)
class Grid:
    """``cells[team][i]``: the node-seconds charged to ``team`` in ``hours[i]`` (None: nothing
    charged, the hour is absent from the answer)."""

    hours: tuple[datetime, ...]
    teams: tuple[str, ...]
    cells: Mapping[str, tuple[float | None, ...]]

    @property
    def peak(self) -> float:
        """The largest node-seconds of one team in one hour (0 when nothing was charged)."""
        return max((v for row in self.cells.values() for v in row if v), default=0.0)

    @property
    def empty(self) -> bool:
        return self.peak <= 0


def usage_grid(usage: Mapping[str, Any], teams: Sequence[str]) -> Grid:
    """The 24 hours ending with the hour of ``usage["observed_at"]``, oldest first, and each
    team's node-seconds in them: ``teams`` in their order, then any other team the answer names,
    by name. An hour outside the day is left out."""
    now = parse_ts(usage["observed_at"]).astimezone(UTC)
    first = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=HOURS - 1)
    hours = tuple(first + timedelta(hours=i) for i in range(HOURS))
    cells: dict[str, list[float | None]] = {t: [None] * HOURS for t in teams}
    for entry in usage.get("hours") or []:
        # Floored into its hour: a database clock in a zone of half an hour still lands somewhere.
        slot = int((parse_ts(entry["hour"]) - first).total_seconds() // 3600)
        if not 0 <= slot < HOURS:
            continue
        for team, seconds in (entry.get("node_seconds") or {}).items():
            row = cells.setdefault(team, [None] * HOURS)
            row[slot] = (row[slot] or 0.0) + float(seconds)
    order = list(teams) + sorted(t for t in cells if t not in set(teams))
    return Grid(hours, tuple(order), {t: tuple(cells[t]) for t in order})


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def hour_label(hour: datetime) -> str:
    return hour.strftime("%Y-%m-%d %H:00Z")


@dataclass(frozen=True)
class Segment:
    """One team's part of one hour's bar."""

    team: str
    hour: str  # RFC 3339, the hour's start
    x: float
    y: float
    width: float
    height: float
    colour: str
    title: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    baseline: int
    segments: tuple[Segment, ...]
    legend: tuple[tuple[str, str], ...]  # (team, colour) of every team, in the table's order
    ticks: tuple[tuple[float, str], ...]  # (x, "HH:00") from a bar's left, every six hours
    peak: float  # the tallest stack's node-seconds
    empty: bool


def team_chart(usage: Mapping[str, Any], teams: Sequence[str]) -> Chart:
    """Stacked bars, one column per hour (oldest on the left), a team's segment in its colour,
    ``teams`` (the sorted team list) stacked from the baseline up; scaled to the tallest stack."""
    grid = usage_grid(usage, teams)
    colours = {t: colour(i) for i, t in enumerate(grid.teams)}
    totals = [sum(grid.cells[t][i] or 0.0 for t in grid.teams) for i in range(HOURS)]
    tallest = max(totals, default=0.0)
    scale = (PLOT - HEADROOM) / tallest if tallest > 0 else 0.0
    segments = []
    for i, hour in enumerate(grid.hours):
        top = float(PLOT)
        for team in grid.teams:
            seconds = grid.cells[team][i]
            if not seconds:
                continue
            height = max(seconds * scale, 1.0)  # a charged hour is never invisible
            top -= height
            segments.append(
                Segment(
                    team,
                    ts(hour) or "",
                    round(i * COLUMN + (COLUMN - BAR) / 2, 1),
                    round(top, 1),
                    round(BAR, 1),
                    round(height, 1),
                    colours[team],
                    f"{team}, {hour_label(hour)}: {seconds:.1f} node-seconds",
                )
            )
    ticks = tuple(
        (round(i * COLUMN + (COLUMN - BAR) / 2, 1), grid.hours[i].strftime("%H:00"))
        for i in range(0, HOURS, 6)
    )
    return Chart(
        WIDTH,
        HEIGHT,
        PLOT,
        tuple(segments),
        tuple(colours.items()),
        ticks,
        tallest,
        tallest <= 0,
    )
