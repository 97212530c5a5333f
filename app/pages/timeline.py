"""A run's timeline (docs/pages.md#a-run-runsrun_id): its steps as bars over time, one lane per
node, from the run view's steps. Pure; the page draws it as SVG from these numbers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.wire import parse_ts

WIDTH = 1000  # the SVG's user units across
LABEL = 160  # units on the left for the lane's name
LANE = 26  # units per lane
NO_NODE_LANE = "(mediator)"  # the steps no node runs: asks and acquires


@dataclass(frozen=True)
class Bar:
    step: str
    state: str
    x: float
    width: float
    title: str


@dataclass(frozen=True)
class Lane:
    node: str
    y: int
    bars: tuple[Bar, ...]


@dataclass(frozen=True)
class Timeline:
    lanes: tuple[Lane, ...]
    height: int
    start: str | None
    end: str | None


def timeline(steps: list[dict[str, Any]], now: datetime) -> Timeline:
    """Lanes in order of the first step each node started; a step still running ends at ``now``."""
    spans: list[tuple[dict[str, Any], datetime, datetime]] = []
    for st in steps:
        if not st.get("started_at"):
            continue
        start = parse_ts(st["started_at"])
        end = parse_ts(st["ended_at"]) if st.get("ended_at") else max(now, start)
        spans.append((st, start, end))
    if not spans:
        return Timeline((), 0, None, None)
    first = min(s for _, s, _ in spans)
    last = max(e for _, _, e in spans)
    total = max((last - first).total_seconds(), 1e-3)
    scale = (WIDTH - LABEL) / total
    order: dict[str, list[Bar]] = {}
    for st, start, end in sorted(spans, key=lambda span: span[1]):
        x = LABEL + (start - first).total_seconds() * scale
        width = max((end - start).total_seconds() * scale, 2.0)
        seconds = (end - start).total_seconds()
        title = f"{st['id']} {st['state']} {seconds:.1f} s"
        order.setdefault(st.get("node") or NO_NODE_LANE, []).append(
            Bar(st["id"], st["state"], round(x, 1), round(width, 1), title)
        )
    lanes = tuple(
        Lane(node, 20 + i * LANE, tuple(bars)) for i, (node, bars) in enumerate(order.items())
    )
    return Timeline(lanes, 20 + len(lanes) * LANE + 6, first.isoformat(), last.isoformat())
