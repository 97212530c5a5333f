"""results.json and results.md: each figure beside its target (docs/design.md#targets) and beside
the figure recorded before the performance work began (``bench/before.json``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BEFORE = HERE / "before.json"


def dig(doc: dict[str, Any] | None, *path: str) -> Any:
    cur: Any = doc
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return cur


def _ratio(doc: dict[str, Any] | None, top: str, a: str, b: str) -> float | None:
    x, y = dig(doc, top, a), dig(doc, top, b)
    if x is None or not y:
        return None
    return round(float(x) / float(y), 2)


@dataclass(frozen=True)
class Row:
    label: str
    value: Callable[[dict[str, Any] | None], Any]
    unit: str = ""
    op: str = ""  # ">=" or "<=": the target is a floor or a ceiling
    limit: float = 0.0

    @property
    def target(self) -> str:
        if not self.op:
            return "—"
        return f"{'≥' if self.op == '>=' else '≤'} {_fmt(self.limit, self.unit)}"

    def met(self, value: Any) -> str:
        if not self.op or value is None:
            return "—"
        v = float(value)
        if (v >= self.limit) if self.op == ">=" else (v <= self.limit):
            return "yes"
        if not self.limit:
            return "**no**"
        times = v / self.limit
        return f"**no** ({times:.3g} × the target)" if times < 100 else f"**no** ({times:.0f} ×)"


def at(*path: str) -> Callable[[dict[str, Any] | None], Any]:
    return lambda doc: dig(doc, *path)


def _fleet(claims: str, key: str) -> Callable[[dict[str, Any] | None], Any]:
    return lambda doc: dig(doc, "fleet_by_claims", claims, key)


def _served(claims: str, what: str) -> Callable[[dict[str, Any] | None], Any]:
    def value(doc: dict[str, Any] | None) -> str | None:
        served = dig(doc, "fleet_by_claims", claims, f"{what}_per_s")
        offered = dig(doc, "fleet_by_claims", claims, f"{what}_offered_per_s")
        if served is None:
            return None
        return f"{served:g} of {offered:g}" if offered is not None else f"{served:g}"

    return value


def fleet_rows(claims: str) -> list[Row]:
    """The fleet's lines for one number of waiting claims; its offered load is in the label."""
    return [
        Row(
            f"fleet, {claims} waiting claims: submit p99",
            _fleet(claims, "submit_p99_ms"),
            " ms",
            "<=",
            100,
        ),
        Row(
            f"fleet, {claims} waiting claims: advert p99",
            _fleet(claims, "advert_p99_ms"),
            " ms",
            "<=",
            50,
        ),
        Row(
            f"fleet, {claims} waiting claims: submits/s served of offered",
            _served(claims, "submits"),
        ),
        Row(
            f"fleet, {claims} waiting claims: adverts/s served of offered",
            _served(claims, "adverts"),
        ),
    ]


def rows(doc: dict[str, Any], before: dict[str, Any] | None) -> list[Row]:
    claims = {"100", "900"}
    for d in (doc, before):
        claims |= set((d or {}).get("fleet_by_claims") or {})
    out = list(ROWS)
    for top, name, what, target in FLOOR_LINES:
        out += floor_rows(top, name, what, target)
    out += candidates_rows(doc) + CANCEL_ROWS + WAKE_ROWS
    for c in sorted(claims, key=int):
        out += fleet_rows(c)
    return out + ROWS_LAST


# The lines measured beside a floor (docs/design.md#targets): results.json's key, the line's
# name in results.md, what it measures, and its target as a fraction of the floor.
FLOOR_LINES = (
    ("submit", "placed submits, pool shape", "201; 2,000 boards, 125 candidates a submit", 0.8),
    (
        "submit_pinned",
        "placed submits, pinned shape",
        "201; 200 boards, each submit naming one",
        0.8,
    ),
    (
        "queued",
        "queued submits, pool shape",
        "202; every board held, 10,000 runs queued before",
        0.5,
    ),
    (
        "queued_pinned",
        "queued submits, pinned shape",
        "202; every board held, 10,000 runs queued before",
        0.5,
    ),
)
# The pooled p99 of every line beside a floor, at most this many times the floor's pooled p99.
P99_VS_FLOOR = 1.5


def _legacy(doc: dict[str, Any] | None, top: str) -> bool:
    """Whether ``top`` is of a results.json written before the lines ran in rounds beside
    floors of their own (``before.json``): one pool floor then, and no median of rounds."""
    return dig(doc, top, "ratio_min") is None


def _rate(top: str) -> Callable[[dict[str, Any] | None], Any]:
    return lambda doc: dig(doc, top, "app_per_s") or dig(doc, top, "per_s")


def _floor_rate(top: str) -> Callable[[dict[str, Any] | None], Any]:
    def value(doc: dict[str, Any] | None) -> Any:
        if _legacy(doc, top):
            return dig(doc, "floor", "per_s") if top in ("submit", "queued") else None
        return dig(doc, top, "floor_per_s")

    return value


def _vs_floor(top: str) -> Callable[[dict[str, Any] | None], Any]:
    """The line's ratio to its floor: the median of its rounds' ratios (an older results.json:
    its rate ÷ the pool floor's)."""

    def value(doc: dict[str, Any] | None) -> Any:
        if not _legacy(doc, top):
            return dig(doc, top, "ratio")
        x, y = _rate(top)(doc), _floor_rate(top)(doc)
        return round(float(x) / float(y), 3) if x is not None and y else None

    return value


def floor_rows(top: str, name: str, what: str, target: float) -> list[Row]:
    """A line beside its floor: its rate, its floor's, the median of the rounds' ratios against
    ``target``, the lowest round, and its pooled p99 against the floor's."""
    return [
        Row(f"{name} ({what})", _rate(top), "/s"),
        Row(f"{name}: its floor (its shape's statements, a Record)", _floor_rate(top), "/s"),
        Row(f"{name} ÷ floor, median of the rounds' ratios", _vs_floor(top), "", ">=", target),
        Row(f"{name} ÷ floor, lowest round", at(top, "ratio_min")),
        Row(f"{name}: p50", at(top, "p50_ms"), " ms"),
        Row(f"{name}: p99 pooled over its windows", at(top, "p99_ms"), " ms"),
        Row(f"{name}: the floor's p99 pooled over its windows", at(top, "floor_p99_ms"), " ms"),
        Row(f"{name}: p99 ÷ the floor's", at(top, "p99_vs_floor"), "", "<=", P99_VS_FLOOR),
    ]


def candidates_rows(doc: dict[str, Any]) -> list[Row]:
    """The fleet's size: dry-run's and placed submit's p50 at the two fleets of the line."""
    small, large = (dig(doc, "candidates", "nodes") or [2000, 20000])[:2]
    out = []
    for key, what in (("dry_run", "dry-run"), ("submit", "placed submit")):
        out += [
            Row(
                f"fleet's size: {what} p50, {small:,} live nodes that it fits",
                at("candidates", key, str(small), "p50_ms"),
                " ms",
            ),
            Row(
                f"fleet's size: {what} p50, {large:,} live nodes",
                at("candidates", key, str(large), "p50_ms"),
                " ms",
            ),
            Row(
                f"fleet's size: {what} p50 at {large:,} ÷ at {small:,}",
                at("candidates", key, "p50_ratio"),
                "",
                "<=",
                1.2,
            ),
        ]
    return out


def _statements(doc: dict[str, Any] | None) -> str | None:
    counts = dig(doc, "cancel", "statements") or {}
    if not counts:
        return None
    return f"{counts.get('cancel')} (a placed submit: {counts.get('submit_placed')})"


CANCEL_ROWS = [
    Row(
        "cancels, pinned shape: submit-and-cancel pairs",
        at("cancel", "cancels_per_s"),
        "/s",
    ),
    Row("cancels: placed submits of the same line", at("cancel", "placed_per_s"), "/s"),
    Row(
        "cancels alone ÷ placed submits (from the pairs' rate, median round)",
        at("cancel", "cancel_vs_placed"),
        "",
        ">=",
        0.5,
    ),
    Row("cancel p50", at("cancel", "cancel_p50_ms"), " ms"),
    Row("cancel p99", at("cancel", "cancel_p99_ms"), " ms"),
    Row("statements of a cancel", _statements),
]

ROWS = [
    Row("pgbench replaying bench/floor.sql", at("submit", "pgbench_per_s"), " TPS"),
    Row(
        "placed submits, pool shape ÷ pgbench (context)",
        lambda d: _ratio(d, "submit", "app_per_s", "pgbench_per_s"),
        "",
    ),
    Row(
        "opening a Record alone on this file system, before the placed line (p50)",
        at("submit", "record_opening", "before", "p50_us"),
        " µs",
    ),
    Row(
        "opening a Record alone, after the placed line (p50)",
        at("submit", "record_opening", "after", "p50_us"),
        " µs",
    ),
]

WAKE_ROWS = [
    Row("wake scan, 20 shapes, one node freed: 1k queued", at("wake_scan_ms", "1000"), " ms"),
    Row(
        "wake scan: 10k queued",
        at("wake_scan_ms", "10000"),
        " ms",
        "<=",
        50,
    ),
    Row("wake scan: 100k queued", at("wake_scan_ms", "100000"), " ms"),
    Row(
        "wake scan: 100k ÷ 1k",
        lambda d: _ratio(d, "wake_scan_ms", "100000", "1000"),
        "",
        "<=",
        2,
    ),
    Row(
        "wake scan, 5 % of queued runs reserving, one node freed: 1k queued",
        at("wake_scan_reserving_ms", "1000"),
        " ms",
    ),
    Row(
        "wake scan, 5 % reserving: 10k queued",
        at("wake_scan_reserving_ms", "10000"),
        " ms",
        "<=",
        50,
    ),
    Row("wake scan, 5 % reserving: 100k queued", at("wake_scan_reserving_ms", "100000"), " ms"),
    Row(
        "wake scan, 5 % reserving: 100k ÷ 1k",
        lambda d: _ratio(d, "wake_scan_reserving_ms", "100000", "1000"),
        "",
        "<=",
        2,
    ),
    Row(
        "release → promoted run's step claimed, p50",
        at("release_to_claim_ms", "p50"),
        " ms",
        "<=",
        100,
    ),
    Row(
        "release → claimed, p99",
        at("release_to_claim_ms", "p99"),
        " ms",
        "<=",
        250,
    ),
]

ROWS_LAST = [
    Row(
        "memory of a waiting claim (server RSS)",
        at("fleet", "rss_kib_per_waiting_claim"),
        " KiB",
    ),
    Row("reaper pass, empty database", at("reaper_pass_ms", "empty"), " ms"),
    Row("reaper pass, 1M finished steps", at("reaper_pass_ms", "1M_steps"), " ms"),
    Row(
        "reaper pass: 1M steps ÷ empty",
        at("reaper_pass_ms", "ratio"),
        "",
        "<=",
        2,
    ),
]


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and value >= 100:
        text = f"{value:,.0f}"
    elif isinstance(value, int | float):
        text = f"{value:,}" if isinstance(value, int) else f"{value:g}"
    else:
        text = str(value)
    return text + unit


def _cpu_entries(doc: dict[str, Any]) -> list[tuple[str, dict[str, float]]]:
    """Each line's windows and where their CPU went (the mean of its windows, by side)."""
    entries = []
    for top, name in [(top, name) for top, name, _, _ in FLOOR_LINES] + [
        ("submit_teams", "placed submits, three quota'd teams")
    ]:
        entries += [
            (name, dig(doc, top, "cpu_cores")),
            (f"{name}: its floor", dig(doc, top, "floor_cpu_cores")),
        ]
    if dig(doc, "submit", "floor_cpu_cores") is None:
        entries.append(("floor", dig(doc, "floor", "cpu_cores")))  # an older results.json
    entries += [
        ("cancels: placed windows", dig(doc, "cancel", "placed_cpu_cores")),
        ("cancels: submit-and-cancel windows", dig(doc, "cancel", "cpu_cores")),
    ]
    for label, cores in (dig(doc, "candidates", "cpu_cores") or {}).items():
        what, nodes = label.split("@")
        entries.append((f"fleet's size: {what}, {int(nodes):,} nodes (one client thread)", cores))
    for claims, run in (doc.get("fleet_by_claims") or {}).items():
        entries.append(
            (f"fleet, {claims} claims (server: gunicorn and the reaper)", run.get("cpu_cores"))
        )
    return [(name, cores) for name, cores in entries if cores]


def _cpu(doc: dict[str, Any]) -> list[str]:
    lines = [
        "| phase | server (gunicorn) | PostgreSQL | client | other processes | whole machine |",
        "|---|---|---|---|---|---|",
    ]
    for name, cores in _cpu_entries(doc):
        ours = sum(cores.get(k) or 0.0 for k in ("server", "postgres", "client"))
        other = round(max(0.0, (cores.get("machine") or 0.0) - ours), 2)
        lines.append(
            f"| {name} | {cores.get('server')} | {cores.get('postgres')} | "
            f"{cores.get('client')} | {other} | {cores.get('machine')} |"
        )
    return lines


def markdown(doc: dict[str, Any], before: dict[str, Any] | None) -> str:
    m = doc["machine"]
    b_commit = dig(before, "machine", "git_commit")
    lines = [
        "# Benchmark results",
        "",
        f"Written by `python -m bench` ({doc['mode']} run) on {m['date']}, source "
        f"`{m['git_commit']}`. Numbers of one run on one machine: compare them with the",
        "`before` column (the same benchmark on the code before the performance work) rather",
        "than with another machine's.",
        "",
        f"- CPU: {m['cpu_model']}, {m['cpu_count']} cores, {m['memory_gib']} GiB; load average "
        f"before the run {m.get('load_average')}",
        f"- PostgreSQL {m['postgresql_version']} on the same machine "
        f"({', '.join(f'{k} {v}' for k, v in m['postgresql_settings'].items())})",
        f"- Python {m['python_version']}; gunicorn {m['server']['workers']} gthread workers × "
        f"{m['server']['threads']} threads; client {m['server']['clients']}",
        "",
    ]
    head = "| measurement | before | this run | target | met? |"
    if before is None:
        head = "| measurement | this run | target | met? |"
    lines += [head, _rule(head)]
    for row in rows(doc, before):
        value = row.value(doc)
        met = row.met(value)
        cells = [row.label]
        if before is not None:
            cells.append(_fmt(row.value(before), row.unit))
        cells += [_fmt(value, row.unit), row.target, met]
        lines.append("| " + " | ".join(cells) + " |")
    if before is not None:
        lines += ["", f"`before`: source `{b_commit}`, {dig(before, 'machine', 'date')}."]
    steps = dig(doc, "reaper_pass_ms", "steps")
    if steps is not None and steps < 1_000_000:
        lines += ["", f"This run's reaper history held {steps:,} steps, not 1M ({doc['mode']})."]
    lines += [
        "",
        "## Where the CPU went (cores busy during each window)",
        "",
        "Other processes: whatever else ran on the machine meanwhile (the benchmark cannot stop",
        "it); a run where they took a large share is worth repeating.",
        "",
    ] + _cpu(doc)
    notes = list(doc.get("notes") or []) + _notes(doc)
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    lines += [
        "",
        "What the profile shows is left, target by target: `bench/README.md`, section",
        '"What the latest run shows is left" (written by hand after a full run).',
    ]
    if doc.get("labday") or doc.get("submit_teams"):
        lines += [""] + teams_section(doc)
    if doc.get("switch"):
        lines += [""] + switch_section(doc["switch"])
    return "\n".join(lines) + "\n"


def switch_section(sw: dict[str, Any]) -> list[str]:
    """The line ``switch`` (bench/switch.py): a failover under load, and the hot path's
    statements after it."""
    two, one = sw["statements_two_hosts"], sw["statements_one_host"]
    return [
        "## A switch to the standby (docs/deploy.md#what-a-switch-costs)",
        "",
        f"Line `switch`: the failover test's scenario `{sw['scenario']}` (primary killed with "
        f"`kill -9`, standby promoted {sw['promoted_after_s']:g} s later, the old primary then "
        "back as a replica), three gunicorn workers and a reaper on the two-host URL, four "
        "agents, a submitter and a canceller. Every check of the test held.",
        "",
        "| measurement | this run |",
        "|---|---|",
        f"| seconds from the kill to the first 201 on the new primary | "
        f"{sw['first_201_after_fault_s']} s ({sw['first_201_after_promotion_s']} s after the "
        "promotion) |",
        f"| requests answered 503 during the switch (the clients retry every 50 ms) | "
        f"{sw['answered_503_during_switch']} of {sw['requests']} requests in all |",
        f"| submits answered 422 `fleet has 0` before the agents advertised again | "
        f"{sw['submits_422_empty_fleet']} |",
        f"| slowest answer (a claim's: beyond its long poll) | {sw['slowest_s']} s "
        f"({sw['slowest_route']}) |",
        f"| a run submitted after the switch, claimed through the listener in | "
        f"{sw['probe_claimed_in_s']} s |",
        f"| statements of a placed submit and of its cancel after the switch: two-host URL "
        f"(the replica first) / the new primary alone | {two['submit_placed']} and "
        f"{two['cancel']} / {one['submit_placed']} and {one['cancel']} |",
    ]


def _pct(x: Any) -> str:
    return "—" if x is None else f"{100 * float(x):.1f} %"


def _met(ok: bool | None) -> str:
    return "—" if ok is None else "yes" if ok else "**no**"


def teams_section(doc: dict[str, Any]) -> list[str]:
    """The lines of teams sharing a fleet (docs/teams.md): the lab day (``bench/labday.py``)
    and the placed line with quota'd teams, with their targets."""
    m = doc["machine"]
    lines = [
        "## Teams sharing the fleet: the lab day and placed submits with teams",
        "",
        f"Lines `labday` and `submit-teams` of `python -m bench` ({doc['mode']} run) on "
        f"{m['date']}, source `{m['git_commit']}`: {m['cpu_model']}, {m['cpu_count']} cores, "
        f"PostgreSQL {m['postgresql_version'].split(' ')[0]} on the same machine, load average "
        f"before the run {m.get('load_average')}. How each figure is made: `bench/README.md`.",
        "",
        "| measurement | this run | target | met? |",
        "|---|---|---|---|",
    ]
    lab = doc.get("labday")
    if lab:
        for name, t in lab["teams"].items():
            err = t["share_error"]
            lines.append(
                f"| lab day: {name}'s share of the board-seconds while every team had runs "
                f"queued (weight {t['weight']:g}) | {t['share']} (weight share "
                f"{t['expected_share']}; off by {_pct(err)}) | within 10 % of its weight share | "
                f"{_met(None if err is None else err <= 0.10)} |"
            )
        worst = lab["longest_wait_non_flooding"]
        lines.append(
            f"| lab day: longest queue wait of the teams that do not flood | "
            f"{_fmt(worst['seconds'], ' s')} ({worst['team']}, `{worst['run_id']}`) | — | — |"
        )
        est = lab["estimate"]
        frac = est["median_abs_error_fraction"]
        lines.append(
            f"| lab day: `expected_start` of the 202 against the promotion, runs that waited "
            f"≥ {est['threshold_s']:g} s: median of abs(error) ÷ wait | {_fmt(frac, '')} "
            f"({est['runs']} runs; median error {_fmt(est['median_signed_error_s'], ' s')}) | "
            f"≤ 0.25 | {_met(None if frac is None else frac <= 0.25)} |"
        )
    st = doc.get("submit_teams")
    if st:
        lowest = min((r["ratio"] for r in st["rounds"] if r.get("ratio") is not None), default=None)
        lines += [
            f"| placed submits, three quota'd teams beside the plain one (201) | "
            f"{_fmt(st['app_per_s'], '/s')} (floor {_fmt(st['floor_per_s'], '/s')}) | — | — |",
            f"| placed submits, three quota'd teams beside the plain one ÷ floor, median of the "
            f"rounds' ratios | {_fmt(st['ratio'], '')} (lowest round {_fmt(lowest, '')}) | ≥ 0.7 | "
            f"{_met(None if st['ratio'] is None else st['ratio'] >= 0.7)} |",
            f"| placed submits with teams: p99 pooled over its windows | "
            f"{_fmt(st['p99_ms'], ' ms')} (floor {_fmt(st['floor_p99_ms'], ' ms')}) | — | — |",
        ]
    if lab:
        lines += ["", *_labday_detail(lab)]
    return lines


def _labday_detail(lab: dict[str, Any]) -> list[str]:
    w, est = lab["window"], lab["estimate"]
    boards = ", ".join(f"{n} of kind {k}" for k, n in lab["boards"].items())
    lines = [
        f"The day: {lab['day_seconds']:g} s of submits (seed {lab['seed']}), boards {boards}; "
        f"every team had runs queued for {w['seconds']:g} s of it ({_pct(w['of_day'])}, "
        f"{w['stretches']} stretches from {w['from_s']} s to {w['to_s']} s); the queue then "
        f"drained in {lab['drained_in_s']:g} s. Cores busy over the day: "
        + ", ".join(f"{k} {v}" for k, v in lab["cpu_cores"].items())
        + ".",
        "",
        "| team | weight | submits/s | submitted | placed at once | queued | refused (429) | "
        "share (sampled) | share by kind | wait p50 | wait p90 | wait max (submitted at) | "
        "wait max by kind | never started |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, t in lab["teams"].items():
        kinds = t.get("by_kind") or {}
        lines.append(
            f"| {name} | {t['weight']:g} | {t['submits_per_s']} | {t['submitted']} | "
            f"{t['placed_at_submit']} | {t['queued_at_submit']} | {t['refused_429']} | "
            f"{t['share']} ({t['share_sampled']}) | "
            + ", ".join(f"{k} {v['share']}" for k, v in kinds.items())
            + f" | {_fmt(t['wait_p50_s'], ' s')} | {_fmt(t['wait_p90_s'], ' s')} | "
            f"{_fmt(t['wait_max_s'], ' s')} ({_fmt(t.get('wait_max_submitted_at_s'), ' s')}) | "
            + ", ".join(f"{k} {_fmt(v['wait_max_s'], ' s')}" for k, v in kinds.items())
            + f" | {t['never_started']} |"
        )
    lines += [
        "",
        "`expected_start` at submit against the promotion, by team (error = expected − actual; "
        "negative: the run started later than said):",
        "",
        "| team | runs that waited ≥ threshold | median abs(error) ÷ wait | median error | "
        "all queued runs with an estimate: median error | median expected wait | "
        "median actual wait |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, t in est["by_team"].items():
        a = t.get("all", {})
        lines.append(
            f"| {name} | {t['runs']} | {_fmt(t['median_abs_error_fraction'], '')} | "
            f"{_fmt(t['median_signed_error_s'], ' s')} | "
            f"{_fmt(a.get('median_signed_error_s'), ' s')} ({a.get('runs', 0)} runs) | "
            f"{_fmt(a.get('median_expected_wait_s'), ' s')} | "
            f"{_fmt(a.get('median_actual_wait_s'), ' s')} |"
        )
    standing = "; ".join(
        f"{name} share {_fmt(_round(t.get('share')), '')}, usage {_fmt(_round(t.get('usage')), '')}"
        for name, t in (lab.get("teams_at_day_end") or {}).items()
    )
    bases = ", ".join(f"{k} {v}" for k, v in est["queued_runs_by_basis"].items())
    p2c = lab["promotion_to_claim_ms"]
    lines += [
        "",
        f"`expected_basis` of the queued runs' 202s: {bases}. From a promotion to the "
        f"board's claim answering with the step: p50 {_fmt(p2c['p50'], ' ms')}, p99 "
        f"{_fmt(p2c['p99'], ' ms')} ({p2c['runs']} promotions). `GET /v1/teams` at the end "
        f"of the day (usage: decayed node-seconds over the active teams'): {standing}. "
        "Warnings and errors in the logs of gunicorn and the reaper: "
        + (
            ", ".join(
                f"{k.split(':')[0]}: {k.split(':')[1].strip()} × {v}"
                for k, v in (lab.get("server_log") or {}).items()
            )
            or "none"
        )
        + ".",
    ]
    return lines


def _round(x: Any) -> Any:
    return round(x, 3) if isinstance(x, float) else x


def _notes(doc: dict[str, Any]) -> list[str]:
    """What a reader of the table should know about this run."""
    out = []
    for claims, run in (doc.get("fleet_by_claims") or {}).items():
        short = [
            what
            for what in ("adverts", "submits")
            if (run.get(f"{what}_per_s") or 0) < 0.95 * (run.get(f"{what}_offered_per_s") or 0)
        ]
        if short:
            out.append(
                f"Fleet with {claims} waiting claims: the server did not keep up with the "
                f"offered {' and '.join(short)}; requests queued up, so its latencies grow with "
                f"the window ({run.get('seconds')} s) and only say that it fell behind."
            )
    for name, cores in _cpu_entries(doc):
        ours = sum(cores.get(k) or 0.0 for k in ("server", "postgres", "client"))
        other = (cores.get("machine") or 0.0) - ours
        if other > 0.25:
            out.append(
                f"{name}: other processes took {other:.2f} cores meanwhile; repeat the run "
                "on a quiet machine before comparing its figures."
            )
    return out


def _rule(head: str) -> str:
    return "|" + "---|" * (head.count("|") - 1)


def write(doc: dict[str, Any], out: Path, record_before: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    if record_before:
        BEFORE.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    before = json.loads(BEFORE.read_text()) if BEFORE.exists() else None
    (out / "results.md").write_text(markdown(doc, before))
