"""The Mediator's answers as people read them: aligned tables and one-line summaries.

Pure: JSON documents of the API in (views, lists, asks: docs/api.md#readers), text out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC
from typing import Any

from app.states import QUEUED, STEP_OPEN
from app.teamchart import usage_grid
from app.wire import parse_ts

OPEN_STEP_STATES = STEP_OPEN


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns aligned on the widest cell; ``None`` shows as ``-``."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [_row(list(headers), widths)] + [_row(row, widths) for row in cells]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return " ".join(str(value).split())  # one line per row, whatever the text holds


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def when(text: object) -> str | None:
    """An RFC 3339 time of the API as ``2024-05-01 12:00:03Z`` (seconds are enough to read)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = parse_ts(text)
    except ValueError:
        return text
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


# ------------------------------------------------------------------------------ requirements


def requirement(line: Mapping[str, Any]) -> str:
    """``board soc=imx8mp`` (``×2`` when the role wants two nodes); takes the output form with
    ``attrs`` nested and the flat form a contract is written in."""
    attrs = line.get("attrs")
    if not isinstance(attrs, Mapping):
        attrs = {k: v for k, v in line.items() if k not in {"as", "capability", "count"}}
    text = " ".join([str(line.get("capability", "?"))] + [f"{k}={v}" for k, v in attrs.items()])
    count = line.get("count", 1)
    return f"{text} x{count}" if isinstance(count, int) and count != 1 else text


def capabilities(entries: object) -> str:
    """A node's advertised capabilities on one line: ``board soc=imx8mp; agent.reason``."""
    if not isinstance(entries, list):
        return ""
    return "; ".join(requirement(e) for e in entries if isinstance(e, Mapping))


def assigned(view: Mapping[str, Any]) -> str:
    """``dut=board-1 host=agent-1`` from the run view's ``assigned``."""
    parts = []
    for a in view.get("assigned") or []:
        nodes = ",".join(str(n.get("node")) for n in a.get("nodes") or [])
        parts.append(f"{a.get('as')}={nodes}")
    return " ".join(parts)


def role_wait(line: Mapping[str, Any]) -> str:
    """What one role of a QUEUED run waits for (docs/queue.md#what-a-queued-runs-view-explains):
    ``dut [board soc=imx8mp]: 1 of 1 busy, held by run-a``."""
    c = line.get("candidates") or {}
    live, busy, draining = int(c.get("live", 0)), int(c.get("busy", 0)), int(c.get("draining", 0))
    count = line.get("count", 1) if isinstance(line.get("count"), int) else 1
    head = f"{line.get('as')} [{requirement(line)}]"
    if live == 0:
        return f"{head}: no live node"
    free = live - busy - draining
    parts = [f"{busy} of {live} busy"]
    held = [str(h) for h in line.get("held_by") or []]
    if held:
        parts.append("held by " + ", ".join(held))
    if draining:
        parts.append(f"{draining} draining")
    reserved = int(c.get("reserved", 0))
    if reserved:
        holders = ", ".join(str(h) for h in line.get("reserved_by") or [])
        parts.append(f"{reserved} reserved" + (f" by {holders}" if holders else ""))
    if free >= count:
        parts.append(f"{free} free")
    return f"{head}: " + ", ".join(parts)


def queue_line(view: Mapping[str, Any]) -> str:
    """One line saying where a QUEUED run stands and what each role waits for."""
    queue = view.get("queue") or {}
    where = f"position {queue.get('position', '?')} ({queue.get('ahead', '?')} ahead)"
    if view.get("priority"):
        where += f", priority {view['priority']}"
    if view.get("reserving"):
        where += ", reserving " + (", ".join(view.get("reserved") or []) or "(nothing yet)")
    if "expected_basis" in view:
        where += ", " + expected_text(view)
    roles = [role_wait(line) for line in view.get("requires") or [] if "candidates" in line]
    return "; ".join([where, *roles])


def expected_text(view: Mapping[str, Any]) -> str:
    """``expected start 14:05 (history)``, the hour and minute of ``expected_start`` as sent
    (UTC), or ``expected start unknown (no_history)`` when there is none (docs/queue.md, "What
    a QUEUED run's view explains")."""
    at = view.get("expected_start")
    shown = at[11:16] if isinstance(at, str) and len(at) >= 16 else "unknown"
    return f"expected start {shown} ({view.get('expected_basis')})"


# ----------------------------------------------------------------------------- run view


def check_line(check: Mapping[str, Any]) -> str:
    """One check of a verdict: ``ok    boot: exit_code want 0, got 0``."""
    mark = "ok  " if check.get("ok") else "FAIL"
    what = str(check.get("what", "?"))
    if check.get("step"):
        what = f"{check['step']}: {what}"
    if "want" in check or "got" in check:
        what += f" want {_short(check.get('want'))}, got {_short(check.get('got'))}"
    if check.get("note"):
        what += f" ({check['note']})"
    return f"{mark}  {what}"


def _short(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return "-" if value is None else str(value)


def verdict_lines(view: Mapping[str, Any]) -> list[str]:
    verdict = view.get("verdict")
    lines = []
    if isinstance(verdict, Mapping):
        lines = [check_line(c) for c in verdict.get("checks") or [] if isinstance(c, Mapping)]
    reject = view.get("reject")
    if isinstance(reject, Mapping) and reject.get("Reason"):
        lines.append(f"FAIL  rejected: {reject['Reason']}")
    return lines


def step_label(step: Mapping[str, Any]) -> str:
    return f"step {step.get('seq')} {step.get('id')}"


def step_table(steps: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        (
            s.get("seq"),
            s.get("id"),
            s.get("kind"),
            s.get("state"),
            s.get("uses"),
            s.get("node"),
            s.get("attempt"),
            s.get("exit_code"),
            when(s.get("started_at")),
            when(s.get("ended_at")),
            s.get("error"),
        )
        for s in steps
    ]
    headers = ("SEQ", "STEP", "KIND", "STATE", "USES", "NODE", "ATTEMPT", "EXIT")
    return table((*headers, "STARTED", "ENDED", "ERROR"), rows)


def run_view(view: Mapping[str, Any]) -> str:
    """``mediator status``: the run, where it stands, its steps and its verdict."""
    fields: list[tuple[str, object]] = [
        ("run", view.get("run_id")),
        ("state", view.get("state")),
        ("work", view.get("work_id")),
        ("principal", view.get("principal")),
        ("created", when(view.get("created_at"))),
        ("ended", when(view.get("ended_at"))),
        ("assigned", assigned(view)),
    ]
    if view.get("state") == QUEUED:
        fields.append(("waiting", queue_line(view)))
    else:
        fields.append(("requires", ", ".join(_role(r) for r in view.get("requires") or [])))
    width = max(len(k) for k, _ in fields)
    out = [f"{k.ljust(width)}  {v}" for k, v in fields if v not in (None, "")]
    for w in view.get("warnings") or []:
        out.append(f"{'warning'.ljust(width)}  {w}")
    steps = view.get("steps") or []
    if steps:
        out += ["", step_table(steps)]
    verdict = verdict_lines(view)
    if verdict:
        state = (view.get("verdict") or {}).get("state") or view.get("state")
        out += ["", f"verdict {state}", *(f"  {line}" for line in verdict)]
    return "\n".join(out)


def _role(line: Mapping[str, Any]) -> str:
    return f"{line.get('as')} [{requirement(line)}]"


def dry_run(answer: Mapping[str, Any]) -> str:
    lines = [f"{answer.get('run_id')}: would be placed on {assigned(answer) or 'nothing'}"]
    lines += [f"warning: {w}" for w in answer.get("warnings") or []]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- lists


def runs_table(runs: Sequence[Mapping[str, Any]]) -> str:
    if not runs:
        return "no runs"
    rows = [
        (
            r.get("run_id"),
            r.get("state"),
            r.get("work_id"),
            r.get("principal"),
            when(r.get("created_at")),
            when(r.get("ended_at")),
        )
        for r in runs
    ]
    return table(("RUN", "STATE", "WORK", "PRINCIPAL", "CREATED", "ENDED"), rows)


def nodes_table(nodes: Sequence[Mapping[str, Any]]) -> str:
    if not nodes:
        return "no nodes"
    rows = [
        (
            n.get("node_id"),
            n.get("label"),
            n.get("live"),
            (n.get("lease") or {}).get("run_id"),
            n.get("drain_mode"),
            capabilities(n.get("capabilities")),
            when(n.get("seen_at")),
        )
        for n in nodes
    ]
    return table(("NODE", "LABEL", "LIVE", "LEASED TO", "DRAIN", "CAPABILITIES", "SEEN"), rows)


def hold_text(hold: object) -> str | None:
    """An operator's hold as ``graceful by ops@lab.example: rewiring`` (docs/operators.md)."""
    if not isinstance(hold, Mapping):
        return None
    return f"{hold.get('mode')} by {hold.get('by')}: {hold.get('reason')}"


def health_text(health: object) -> str | None:
    """``ok``, or ``quarantined since 2026-12-07 05:00:00Z: <reason>``; strikes when there are."""
    if not isinstance(health, Mapping):
        return None
    text = str(health.get("state") or "ok")
    if text == "quarantined":
        text += f" since {when(health.get('since'))}: {health.get('reason')}"
    strikes = health.get("strikes")
    if isinstance(strikes, int) and strikes > 0:
        text += f" ({strikes} strike{'s' if strikes != 1 else ''})"
    return text


def node_lines_table(nodes: Sequence[Mapping[str, Any]]) -> str:
    """``mediator node list`` and the line each ``mediator node`` change prints: a node's lease,
    its effective drain, an operator's hold and its health, as ``GET /v1/nodes`` has them."""
    if not nodes:
        return "no nodes"
    rows = [
        (
            n.get("node_id"),
            n.get("live"),
            (n.get("lease") or {}).get("run_id"),
            n.get("drain_mode"),
            hold_text(n.get("hold")),
            health_text(n.get("health")),
        )
        for n in nodes
    ]
    return table(("NODE", "LIVE", "LEASE RUN", "DRAINING", "HOLD", "HEALTH"), rows)


def percent(value: object) -> str | None:
    """A fraction of the API as ``75%`` or ``33.3%``; null stays null (shown ``-``)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return f"{round(value * 100, 1):g}%"


def number(value: object) -> str | None:
    """``3``, ``2.5``, ``0.000208``: three significant digits at most; null stays null."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return f"{value:.3g}"


def teams_table(teams: Sequence[Mapping[str, Any]]) -> str:
    """``mediator teams``: one line per team, as ``GET /v1/teams`` lists them."""
    if not teams:
        return "no teams"
    rows = [
        (
            t.get("name"),
            number(t.get("weight")),
            percent(t.get("share")),
            percent(t.get("usage")),
            number(t.get("factor")),
            t.get("running_nodes"),
            t.get("queued"),
            t.get("max_nodes"),
            t.get("max_queued"),
        )
        for t in teams
    ]
    headers = ("TEAM", "WEIGHT", "SHARE", "USAGE", "FACTOR", "RUNNING", "QUEUED", "MAX NODES")
    return table((*headers, "MAX QUEUED"), rows)


SPARKS = " ▁▂▃▄▅▆▇█"  # nothing, then eighths of the largest hour


def spark(seconds: float | None, peak: float) -> str:
    """One hour of one team: a space for nothing charged, else at least the lowest bar."""
    if not seconds or peak <= 0:
        return SPARKS[0]
    eighths = -(-seconds * (len(SPARKS) - 1) // peak)  # rounded up: a charged hour shows
    return SPARKS[min(max(int(eighths), 1), len(SPARKS) - 1)]


def sparklines(usage: Mapping[str, Any], teams: Sequence[str]) -> str:
    """Each team's node-seconds in each hour of the last day (``GET /v1/teams/usage``), one
    character an hour, oldest on the left, scaled to the largest hour of any team."""
    grid = usage_grid(usage, teams)
    if not grid.teams:
        return ""
    first, last = grid.hours[0], grid.hours[-1]
    head = f"usage by hour, {first:%Y-%m-%d %H:00} to {last:%H:00} UTC" + (
        f" (█ = {grid.peak:.0f} node-seconds)" if not grid.empty else ": nothing charged"
    )
    width = max(len(t) for t in grid.teams)
    lines = [head]
    for team in grid.teams:
        line = "".join(spark(v, grid.peak) for v in grid.cells[team])
        lines.append(f"{team.ljust(width)}  |{line}|")
    return "\n".join(lines)


def answer_fields(schema: object) -> str:
    """The fields an answer takes: ``verdict=approve|reject, note:string``."""
    if not isinstance(schema, Mapping):
        return ""
    required = set(schema.get("required") or [])
    parts = []
    for name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, Mapping) else {}
        if isinstance(prop.get("enum"), list):
            kind = "|".join(_short(v) for v in prop["enum"])
        else:
            kind = str(prop.get("type", "any"))
        parts.append(f"{name}{'' if name in required else '?'}={kind}")
    return ", ".join(parts)


def asks_table(asks: Sequence[Mapping[str, Any]]) -> str:
    if not asks:
        return "no open asks"
    rows = [
        (
            a.get("run_id"),
            a.get("seq"),
            a.get("step"),
            a.get("prompt"),
            answer_fields(a.get("schema")),
            a.get("can_answer"),
            ", ".join(a.get("answerers") or []),
            when(a.get("deadline")),
        )
        for a in asks
    ]
    headers = ("RUN", "SEQ", "STEP", "PROMPT", "FIELDS", "YOU MAY ANSWER", "ANSWERERS")
    return table((*headers, "DEADLINE"), rows)


def profiles(
    path: object,
    named: Mapping[str, Mapping[str, str]],
    default: str | None,
    chosen: str | None,
    using: Mapping[str, Mapping[str, Any]],
) -> str:
    """``mediator profiles``: the file's profiles (a token only as "set"), then what is used."""
    lines = [f"file       {path}" + ("" if named or default else " (no profiles)")]
    if named:
        rows = []
        for name in sorted(named):
            profile = named[name]
            kept = "file" if profile.get("token_file") else "set" if profile.get("token") else None
            mark = "*" if name == chosen else ""
            tag = " (default)" if name == default else ""
            rows.append([f"{mark}{name}{tag}", profile.get("url"), kept, profile.get("principal")])
        lines += ["", table(["PROFILE", "URL", "TOKEN", "PRINCIPAL"], rows), ""]
    token = using["token"]
    lines += [
        f"url        {using['url']['value']}  (from {using['url']['from']})",
        "token      " + (f"set  (from {token['from']})" if token["set"] else "none"),
        "principal  "
        + (
            f"{using['principal']['value']}  (from {using['principal']['from']})"
            if using["principal"]["value"]
            else "none"
        ),
    ]
    return "\n".join(lines)
