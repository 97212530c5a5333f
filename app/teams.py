"""Teams (docs/teams.md): the configured list, its validation, and who belongs to which.

A team in the configuration is ``{name, weight?, max_nodes?, max_queued?, members?}``; ``teams``
in a file, or the JSON of ``MEDIATOR_TEAMS``. ``default`` always exists (weight 1, no limits)
unless configured; ``health`` is the Mediator's own and no configuration may name it.
``max_queued`` refuses a submit that would queue (docs/teams.md, "Queue length"), weights order
the queue (:class:`Standing`, docs/teams.md "Fair share") and ``max_nodes`` caps what a team's
runs hold (:class:`Quota`, docs/teams.md "Quotas"). Nothing here depends on Flask or the
database.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.errors import ConfigError

DEFAULT_TEAM = "default"
HEALTH_TEAM = "health"  # the team of the Mediator's own health runs (docs/teams.md)
OTHER_LABEL = "other"  # the metric label of a stored team no longer configured
FIELDS = ("name", "weight", "max_nodes", "max_queued", "members")
# Letters, digits, ".", "_" and "-", starting with a letter or digit: a name fits a URL's query,
# a metric label and a file name as it is.
NAME_RULE = "1-63 characters of [A-Za-z0-9._-], starting with a letter or a digit"
NAME_PATTERN = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
GLOB_CHARACTERS = frozenset("@*?[")  # a member entry holding one of them is a principal glob
MAX_MEMBER = 200


def is_team_name(value: object) -> bool:
    return isinstance(value, str) and NAME_PATTERN.match(value) is not None


def is_glob(entry: str) -> bool:
    return any(c in GLOB_CHARACTERS for c in entry)


@dataclass(frozen=True)
class Team:
    name: str
    weight: float = 1
    max_nodes: int | None = None  # None: no limit
    max_queued: int | None = None  # None: no limit
    members: tuple[str, ...] = ()  # token names and principal globs, as configured

    def has_token(self, token_name: str) -> bool:
        return any(not is_glob(m) and m == token_name for m in self.members)

    def has_principal(self, principal: str) -> bool:
        """A glob matching the principal, ignoring case (e-mail addresses are compared so)."""
        folded = principal.casefold()
        return any(is_glob(m) and fnmatch.fnmatchcase(folded, m.casefold()) for m in self.members)


@dataclass(frozen=True)
class Quota:
    """A team's ``max_nodes``, with how its leases are counted (:meth:`Teams.apart`)."""

    team: str
    apart: list[str] | None
    max_nodes: int


class Teams:
    """The teams of a configuration, in its order, with ``default`` last unless configured."""

    def __init__(self, configured: Iterable[Team]) -> None:
        self.configured: tuple[Team, ...] = tuple(configured)
        by_name = {t.name: t for t in self.configured}
        by_name.setdefault(DEFAULT_TEAM, Team(DEFAULT_TEAM))
        self._by_name = by_name

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Teams:
        return cls(config.get("teams") or ())

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def get(self, name: str) -> Team | None:
        return self._by_name.get(name)

    @property
    def names(self) -> list[str]:
        """Every team's name (the configured ones and ``default``), sorted."""
        return sorted(self._by_name)

    def label(self, name: str) -> str:
        """The metric label of a run's stored team: bounded by the configured names,
        ``default``, ``health`` and ``other`` (a name no longer configured)."""
        if name in self._by_name or name == HEALTH_TEAM:
            return name
        return OTHER_LABEL

    def counted_as(self, name: str) -> str:
        """The team whose counts a run's stored team adds to: itself while configured (or
        ``health``), else ``default`` (docs/teams.md, "A team removed")."""
        if name in self._by_name or name == HEALTH_TEAM:
            return name
        return DEFAULT_TEAM

    def apart(self, name: str) -> list[str] | None:
        """How rows keyed by a stored team are counted as ``name``'s: None, by that name alone
        (a configured team other than ``default``); for ``default``, every stored name except
        these (the other configured teams and ``health``), since a name no longer configured
        counts as ``default``."""
        if name != DEFAULT_TEAM:
            return None
        return sorted(n for n in self._by_name if n != DEFAULT_TEAM) + [HEALTH_TEAM]

    def quota(self, stored: str) -> Quota | None:
        """The ``max_nodes`` a run of the stored team ``stored`` is held to, or None (no limit;
        ``health`` has none)."""
        if stored == HEALTH_TEAM:
            return None
        team = self._by_name[self.counted_as(stored)]
        if team.max_nodes is None:
            return None
        return Quota(team.name, self.apart(team.name), team.max_nodes)

    @property
    def shared(self) -> bool:
        """Whether any team is configured: without one every run is ``default``'s and the queue
        is ordered as it was before teams (nothing read or computed for them)."""
        return bool(self.configured)

    def of_member(self, token_name: str, principal: str | None) -> str | None:
        """The first team whose ``members`` lists the token's name or has a glob matching
        ``principal`` (the caller passes it only when vouched for), else None."""
        for team in self.configured:
            if team.has_token(token_name) or (
                principal is not None and team.has_principal(principal)
            ):
                return team.name
        return None


# ------------------------------------------------------------------ the configured list


def parse_teams(key: str, entries: Any) -> tuple[Team, ...]:
    """The ``teams`` list of the configuration (file entries, or the JSON of ``MEDIATOR_TEAMS``).
    A wrong entry raises :class:`ConfigError`, one line naming the entry and its field."""
    entries = config_list(key, entries, "teams")
    teams: list[Team] = []
    names: set[str] = set()
    for i, entry in enumerate(entries):
        team = entry if isinstance(entry, Team) else parse_team(f"{key}[{i}]", entry)
        if team.name in names:
            raise ConfigError(f"{key}[{i}].name: {team.name!r} is the name of an earlier team")
        names.add(team.name)
        teams.append(team)
    return tuple(teams)


def config_list(key: str, entries: Any, what: str) -> list[Any] | tuple[Any, ...]:
    """A configured list (teams, tokens): as the file gives it, or the JSON of its ``MEDIATOR_*``
    variable (empty: none)."""
    if isinstance(entries, str):
        try:
            entries = json.loads(entries) if entries.strip() else []
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{key}: must be a JSON list ({exc.msg})") from None
    if not isinstance(entries, (list, tuple)):
        raise ConfigError(f"{key}: must be a list of {what}")
    return entries


def check_entry(where: str, entry: Any, fields: Iterable[str]) -> Mapping[str, Any]:
    """A configured entry (a team, a token) is a mapping of known fields; ``where`` names it in
    the error (``teams[0]``)."""
    known = list(fields)
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: must be a mapping of {', '.join(known)}")
    unknown = sorted(str(k) for k in entry if k not in known)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown field (fields: {', '.join(known)})")
    return entry


def parse_team(where: str, entry: Any) -> Team:
    entry = check_entry(where, entry, FIELDS)
    name = entry.get("name")
    if not is_team_name(name):
        raise ConfigError(f"{where}.name: must be {NAME_RULE}")
    assert isinstance(name, str)
    if name == HEALTH_TEAM:
        raise ConfigError(f"{where}.name: {HEALTH_TEAM!r} is the Mediator's own team")
    weight = entry.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
        raise ConfigError(f"{where}.weight: must be a number greater than 0")
    if weight == float("inf"):
        raise ConfigError(f"{where}.weight: must be a finite number")
    return Team(
        name=name,
        weight=weight,
        max_nodes=_limit(where, "max_nodes", entry.get("max_nodes")),
        max_queued=_limit(where, "max_queued", entry.get("max_queued")),
        members=_members(where, entry.get("members")),
    )


def _limit(where: str, field: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{where}.{field}: must be an integer of at least 1 (leave it out for no limit)"
        )
    return value


def _members(where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}.members: must be a list of token names and principal globs")
    for member in value:
        if not isinstance(member, str) or not 0 < len(member) <= MAX_MEMBER or "\x00" in member:
            raise ConfigError(f"{where}.members: each entry is a text of 1-{MAX_MEMBER} characters")
    return tuple(value)


def check_token_teams(tokens: Iterable[Any], teams: Teams) -> None:
    """Start-up refuses a token whose ``team`` or ``teams`` names a team the configuration does
    not have (``default`` always exists)."""
    for token in tokens:
        for name in sorted({*([token.team] if token.team else []), *token.teams}):
            if name not in teams:
                raise ConfigError(
                    f"tokens: token {token.name!r} names team {name!r}, which teams does not"
                    " configure"
                )


# ------------------------------------------------------------------ fair share


def rank_of(share: float | None, spent: float) -> float:
    """A team's place in the scans' order, lowest first: minus its factor S / (U + R·h)
    (``spent`` = U + R·h); a team with a share and nothing spent before all, a team outside the
    sums (no share) after all. The queue's order and the expected start's replay of it
    (app/estimate.py) both rank by it."""
    if share is None:
        return 0.0
    return float("-inf") if spent <= 0 else -share / spent


class Standing:
    """Where each team stands for the queue's order (docs/teams.md, "Fair share"), from what is
    stored by team name: usage U (decayed node-seconds), the nodes its runs hold R, and which
    teams have runs queued or running. A stored name no longer configured counts as
    ``default``; ``health`` is in no sum and has no factor.

    ``factor(team)`` = S / (U + R·h), S the team's weight over the weights of the active teams;
    None when U + R·h = 0 (ranked first). ``hold(team, n)`` raises R by hand as a scan places."""

    def __init__(
        self,
        teams: Teams,
        usage: Mapping[str, float],
        held: Mapping[str, int],
        active: Iterable[str],
        running_charge_seconds: float,
        *,
        queued: Mapping[str, int] | None = None,
    ) -> None:
        self.teams = teams
        self.h = running_charge_seconds
        self.queued: dict[str, int] = {}
        self.queued_by_stored: dict[str, int] = dict(queued or {})
        for name, n in (queued or {}).items():
            into = teams.counted_as(name)
            self.queued[into] = self.queued.get(into, 0) + n
        self.usage: dict[str, float] = {}
        self.held: dict[str, int] = {}
        for name, value in usage.items():
            into = teams.counted_as(name)
            self.usage[into] = self.usage.get(into, 0.0) + max(value, 0.0)
        for name, n in held.items():
            into = teams.counted_as(name)
            self.held[into] = self.held.get(into, 0) + n
        self.active = {teams.counted_as(n) for n in active} | {n for n, c in self.held.items() if c}
        self.active.discard(HEALTH_TEAM)
        weights = [t.weight for n in self.active if (t := teams.get(n)) is not None]
        self.total_weight = float(sum(weights))
        self.total_usage = sum(u for n, u in self.usage.items() if n in self.active)

    def share(self, name: str) -> float | None:
        team = self.teams.get(name)
        if team is None or name not in self.active or not self.total_weight:
            return None
        return team.weight / self.total_weight

    def normalised_usage(self, name: str) -> float | None:
        if name not in self.active:
            return None
        if not self.total_usage:
            return 0.0
        return self.usage.get(name, 0.0) / self.total_usage

    def factor(self, name: str) -> float | None:
        share = self.share(name)
        if share is None:
            return None
        spent = self.usage.get(name, 0.0) + self.held.get(name, 0) * self.h
        return share / spent if spent > 0 else None

    def rank(self, stored: str) -> float:
        """The team's place in the order, lowest first: minus its factor; a team with nothing
        spent (factor None while it has a share), and ``health``, first."""
        name = self.teams.counted_as(stored)
        if name == HEALTH_TEAM:
            return float("-inf")
        spent = self.usage.get(name, 0.0) + self.held.get(name, 0) * self.h
        return rank_of(self.share(name), spent)

    def order_of(self, stored: str) -> tuple[list[str], list[str]]:
        """The stored team names with queued runs ranked before ``stored``'s team, and those
        ranked with it (``stored`` among them): a queued run's place in the scan order."""
        own = self.rank(stored)
        before: list[str] = []
        same: list[str] = []
        for name in sorted(set(self.queued_by_stored) | {stored}):
            rank = self.rank(name)
            if rank < own:
                before.append(name)
            elif rank == own:
                same.append(name)
        return before, same

    def queued_of(self, name: str) -> int:
        return self.queued.get(name, 0)

    def holding(self, stored: str) -> int:
        return self.held.get(self.teams.counted_as(stored), 0)

    def hold(self, stored: str, nodes: int) -> None:
        name = self.teams.counted_as(stored)
        self.held[name] = self.held.get(name, 0) + nodes


def least_width(counts: Iterable[int]) -> int:
    """The fewest distinct nodes an assignment of roles with these ``count``s can have (roles may
    share a node): what a queued run needs at least of its team's ``max_nodes``."""
    return max(counts, default=0)


def quota_refusal(team: str, width: int, max_nodes: int) -> str:
    """The 422 of a run wider than its team's quota (docs/teams.md, "Quotas")."""
    return f"requires exceeds team {team}'s quota: {width} nodes, max_nodes {max_nodes}"


def quota_reason(team: str, max_nodes: int, holding: int) -> str:
    """Why a queued run of a team at its quota waits."""
    return f"team {team} at its quota of {max_nodes} nodes (holding {holding})"
