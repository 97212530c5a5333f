"""Bearer tokens and their roles: the configured list, its validation, the check of a presented
secret, and new tokens for ``mediator server token new``.

A token in the configuration is ``{name, id?, sha256 | argon2, roles, principal?, nodes?,
max_priority?, vouches_for_principals?, expires?, team?, teams?}`` (teams: docs/teams.md): the
secret itself is never stored, only its SHA-256 (hex) or an argon2 hash (the PHC string
``$argon2id$…``). The legacy single ``token`` is one token named ``token`` with every role.

What a presented secret costs (docs/tokens.md#what-a-presented-secret-costs): a
``med_<id>_<random>`` secret (what ``mediator server token new`` prints) is checked only against
the entry with that id, so at most one slow hash per request; any other secret is looked up by
its SHA-256 among the sha256 entries, and tried against the argon2 entries without an id only while
``tokens.legacy_argon2`` is true. Slow verifications are bounded per process
(``auth.slow_concurrency``), a token found is kept by the SHA-256 of its secret, and a refused
secret is remembered for a minute, so an unknown secret costs one SHA-256. Nothing here depends on
Flask.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import argon2
import yaml

from app.contract.fields import is_valid_id
from app.errors import ConfigError
from app.names import NAME_RULE
from app.teams import NAME_RULE as TEAM_NAME_RULE
from app.teams import check_entry, config_list, is_team_name
from app.wire import parse_ts

ROLES = ("submitter", "node", "answerer", "reader", "operator")
ALL_ROLES = frozenset(ROLES)
LEGACY_NAME = "token"  # the name of the legacy single token: on runs, in logs and events
OPERATOR_PRIORITY = 100  # the max_priority of operators and of the legacy token by default
PRIORITY_RANGE = (-100, 100)
FIELDS = (
    "name",
    "id",
    "sha256",
    "argon2",
    "roles",
    "principal",
    "nodes",
    "max_priority",
    "expires",
    "vouches_for_principals",
    "team",
    "teams",
)
MAX_REFUSED = 4096  # refused secrets remembered per process (a misconfigured agent retrying)
REFUSAL_SECONDS = 60.0  # how long a refused secret is answered from memory
SECRET_PREFIX = "med_"  # med_<id>_<random>: the id names the one entry to check
ID_PATTERN = re.compile(r"\A[a-z2-7]{8,64}\Z")  # base32, lower case
ID_LENGTH = 16

_hasher = argon2.PasswordHasher()


@dataclass(frozen=True)
class Token:
    """One configured token. ``nodes`` None: any node; ``principal`` None: the caller's
    ``X-Enode-Principal`` header is taken as given (self-declared)."""

    name: str
    roles: frozenset[str]
    principal: str | None = None
    # A trusted bridge: the principals its callers declare may answer restricted asks
    # (docs/tokens.md#principal).
    vouches_for_principals: bool = False
    nodes: frozenset[str] | None = None
    max_priority: int = 0
    sha256: bytes | None = None  # the digest of the secret
    argon2: str | None = None  # the PHC string of the secret's argon2 hash
    id: str | None = None  # the id of a med_<id>_<random> secret
    expires: datetime | None = None  # no longer accepted from this time on
    # docs/teams.md: the token's default team, and the others its contracts may name.
    team: str | None = None
    teams: frozenset[str] = frozenset()

    def expired(self, now: datetime) -> bool:
        return self.expires is not None and now >= self.expires

    def __repr__(self) -> str:  # the hashes stay out of every log line and traceback
        return f"Token(name={self.name!r}, roles={sorted(self.roles)!r})"


def entry_digest(token: Token) -> str:
    """A digest of everything a token's configuration entry says: a session signed in with it
    (docs/pages.md#signing-in) ends when the entry is removed or changes (roles, hash, principal,
    expiry...)."""
    entry = {
        "name": token.name,
        "roles": sorted(token.roles),
        "principal": token.principal,
        "vouches": token.vouches_for_principals,
        "nodes": sorted(token.nodes) if token.nodes is not None else None,
        "max_priority": token.max_priority,
        "sha256": token.sha256.hex() if token.sha256 is not None else None,
        "argon2": token.argon2,
        "id": token.id,
        "expires": token.expires.isoformat() if token.expires is not None else None,
    }
    # Only when set: the digests of entries without teams stay what they were (their sessions too).
    if token.team is not None:
        entry["team"] = token.team
    if token.teams:
        entry["teams"] = sorted(token.teams)
    return hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()


def digest(secret: str) -> bytes:
    """The SHA-256 of a secret: the key of the cache and the form of a ``sha256`` hash."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def check_secret(token: Token, secret: str, secret_digest: bytes) -> bool:
    """Whether ``secret`` is ``token``'s, in constant time for its hash kind: the digests are
    compared with :func:`hmac.compare_digest`, an argon2 hash by argon2 itself."""
    if token.sha256 is not None:
        return hmac.compare_digest(secret_digest, token.sha256)
    assert token.argon2 is not None
    try:
        return _hasher.verify(token.argon2, secret)
    except argon2.exceptions.VerificationError:
        return False
    except argon2.exceptions.InvalidHashError:
        return False


class SlowVerificationBusy(Exception):
    """Every slot for a slow (argon2) verification stayed taken for the whole wait: the request
    is answered 503 rather than queued without bound."""


@dataclass
class AuthCounts:
    """What the process's verifications did, for the metrics and the tests (counted, not timed)."""

    slow_verifications: int = 0  # argon2 verifications run
    refused: int = 0  # secrets refused after a look-up
    refused_from_memory: int = 0  # secrets refused from the refusal memory, no look-up at all
    busy: int = 0  # requests answered 503: no slot for a slow verification
    rate_limited: int = 0  # requests answered 429: too many failures from their address


def secret_id(secret: str) -> str | None:
    """The id of a ``med_<id>_<random>`` secret, else None."""
    if not secret.startswith(SECRET_PREFIX):
        return None
    ident, sep, rest = secret[len(SECRET_PREFIX) :].partition("_")
    return ident if sep and rest and ID_PATTERN.match(ident) else None


class TokenSet:
    """The tokens a process accepts, and which presented secrets it has already checked.

    Correctness never depends on the caches: a cached token is one of this process's own
    configuration, which does not change while it runs (a reload of the workers re-reads it), and
    its expiry is checked on every request."""

    def __init__(
        self,
        tokens: Iterable[Token],
        *,
        legacy_argon2: bool = True,
        slow_concurrency: int = 2,
        slow_wait_seconds: float = 5.0,
        on_count: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tokens: tuple[Token, ...] = tuple(tokens)
        self._by_id = {t.id: t for t in self.tokens if t.id is not None}
        self._by_sha256 = {t.sha256: t for t in self.tokens if t.sha256 is not None}
        # Entries issued before ids: each unknown secret would be tried against every one of them.
        self.legacy_argon2_tokens = tuple(
            t for t in self.tokens if t.argon2 is not None and t.id is None
        )
        self._try_legacy = legacy_argon2
        self._slots = threading.BoundedSemaphore(max(1, slow_concurrency))
        self._slow_wait = slow_wait_seconds
        self._verified: dict[bytes, Token] = {}
        self._refused: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()
        self._clock = clock
        self._on_count = on_count
        self.counts = AuthCounts()

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], on_count: Callable[[str], None] | None = None
    ) -> TokenSet:
        """``tokens`` and the legacy ``token`` side by side."""
        tokens = list(config["tokens"])
        if config["token"]:
            tokens.append(legacy_token(config["token"]))
        return cls(
            tokens,
            legacy_argon2=config.get("tokens.legacy_argon2", True),
            slow_concurrency=config.get("auth.slow_concurrency", 2),
            slow_wait_seconds=config.get("database.pool_timeout", 5.0),
            on_count=on_count,
        )

    def __len__(self) -> int:
        return len(self.tokens)

    def verify(self, secret: str) -> Token | None:
        """The token whose secret ``secret`` is, or None (also for an expired token). Raises
        :class:`SlowVerificationBusy` when a slow verification found no slot in time."""
        if not secret:
            return None
        key = digest(secret)
        found = self._verified.get(key)
        if found is None:
            if self._remembered_refusal(key):
                self._count("refused_from_memory")
                return None
            found = self._look_up(secret, key)
            with self._lock:
                if found is not None:
                    self._verified[key] = found  # at most one entry per configured token
                else:
                    self._refused[key] = self._clock()
                    self._refused.move_to_end(key)
                    while len(self._refused) > MAX_REFUSED:
                        self._refused.popitem(last=False)
            if found is None:
                self._count("refused")
                return None
        if found.expired(datetime.now(UTC)):
            return None
        return found

    def named(self, name: str) -> Token | None:
        """The configured token of that name (names are unique), or None."""
        for token in self.tokens:
            if token.name == name:
                return token
        return None

    def is_verified(self, key: bytes) -> bool:
        """Whether the secret of digest ``key`` was verified by this process already."""
        return key in self._verified

    def count(self, what: str) -> None:
        """Count an outcome decided outside the check (a request refused for its address)."""
        self._count(what)

    def _remembered_refusal(self, key: bytes) -> bool:
        at = self._refused.get(key)
        return at is not None and self._clock() - at < REFUSAL_SECONDS

    def _look_up(self, secret: str, key: bytes) -> Token | None:
        """At most one slow verification for a ``med_`` secret, none for an unknown one unless
        legacy argon2 entries are tried."""
        ident = secret_id(secret)
        if ident is not None:
            token = self._by_id.get(ident)
            return token if token is not None and self._check(token, secret, key) else None
        token = self._by_sha256.get(key)
        if token is not None and hmac.compare_digest(key, token.sha256 or b""):
            return token
        if self._try_legacy:
            for token in self.legacy_argon2_tokens:
                if self._check(token, secret, key):
                    return token
        return None

    def _check(self, token: Token, secret: str, key: bytes) -> bool:
        """:func:`check_secret`, an argon2 hash only in one of the process's slow slots."""
        if token.argon2 is None:
            return check_secret(token, secret, key)
        if not self._slots.acquire(timeout=self._slow_wait):
            self._count("busy")
            raise SlowVerificationBusy()
        try:
            self._count("slow_verifications")
            return check_secret(token, secret, key)
        finally:
            self._slots.release()

    def _count(self, what: str) -> None:
        with self._lock:
            setattr(self.counts, what, getattr(self.counts, what) + 1)
        if self._on_count is not None:
            self._on_count(what)


def legacy_token(secret: str) -> Token:
    """The legacy single ``token``: every role, max_priority 100, for the original clients."""
    return Token(
        name=LEGACY_NAME,
        roles=ALL_ROLES,
        max_priority=OPERATOR_PRIORITY,
        sha256=digest(secret),
        # The original's runctl answers restricted asks with it, naming the principal
        # (docs/tokens.md#the-legacy-token).
        vouches_for_principals=True,
    )


# ------------------------------------------------------------------ the configured list


def parse_tokens(key: str, entries: Any) -> tuple[Token, ...]:
    """The ``tokens`` list of the configuration (file entries, or the JSON of
    ``MEDIATOR_TOKENS``) as :class:`Token` objects. A wrong entry raises :class:`ConfigError`,
    one line naming the entry and its field (``tokens[1].roles: …``), never a hash."""
    entries = config_list(key, entries, "tokens")
    tokens: list[Token] = []
    names: set[str] = set()
    ids: set[str] = set()
    hashes: set[bytes] = set()
    for i, entry in enumerate(entries):
        # An entry already parsed (a configuration handed on as its values) is kept as it is.
        token = entry if isinstance(entry, Token) else parse_token(f"{key}[{i}]", entry)
        if token.name in names:
            raise ConfigError(f"{key}[{i}].name: {token.name!r} is the name of an earlier token")
        if token.sha256 is not None and token.sha256 in hashes:
            raise ConfigError(f"{key}[{i}].sha256: the same secret as an earlier token")
        if token.id is not None and token.id in ids:
            raise ConfigError(f"{key}[{i}].id: {token.id!r} is the id of an earlier token")
        names.add(token.name)
        if token.id is not None:
            ids.add(token.id)
        if token.sha256 is not None:
            hashes.add(token.sha256)
        tokens.append(token)
    return tuple(tokens)


def parse_token(where: str, entry: Any) -> Token:
    """One entry of ``tokens``; ``where`` names it in errors (``tokens[0]``)."""
    entry = check_entry(where, entry, FIELDS)
    name = entry.get("name")
    if not isinstance(name, str) or not is_valid_id(name):
        raise ConfigError(f"{where}.name: must be {NAME_RULE}")
    if name == LEGACY_NAME:
        raise ConfigError(f"{where}.name: {LEGACY_NAME!r} is the legacy token's name")
    roles = _roles(where, entry.get("roles"))
    sha, phc = _hash(where, entry)
    principal = entry.get("principal")
    if principal is not None and (
        not isinstance(principal, str) or not 0 < len(principal) <= 200 or "\x00" in principal
    ):
        raise ConfigError(f"{where}.principal: must be a text of 1-200 characters")
    nodes = _nodes(where, entry.get("nodes"), roles)
    max_priority = _priority(where, entry.get("max_priority"), roles)
    return Token(
        name=name,
        roles=roles,
        principal=principal,
        vouches_for_principals=_vouches(where, entry),
        nodes=nodes,
        max_priority=max_priority,
        sha256=sha,
        argon2=phc,
        id=_id(where, entry.get("id")),
        expires=_expires(where, entry.get("expires")),
        team=_team(where, entry.get("team")),
        teams=_teams(where, entry.get("teams")),
    )


def _team(where: str, value: Any) -> str | None:
    """``team``: the token's default team (start-up checks that it is configured)."""
    if value is None:
        return None
    if not is_team_name(value):
        raise ConfigError(f"{where}.team: a team name is {TEAM_NAME_RULE}")
    return str(value)


def _teams(where: str, value: Any) -> frozenset[str]:
    """``teams``: the other teams the token's contracts may name in ``queue.team``."""
    if value is None:
        return frozenset()
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}.teams: must be a list of team names")
    for name in value:
        if not is_team_name(name):
            raise ConfigError(f"{where}.teams: a team name is {TEAM_NAME_RULE}")
    return frozenset(value)


def _id(where: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise ConfigError(f"{where}.id: must be 8-64 characters of base32 (a-z, 2-7)")
    return value


def _expires(where: str, value: Any) -> datetime | None:
    """An RFC 3339 time with its offset (YAML may hand a datetime already)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = parse_ts(value)
        except ValueError:
            value = None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ConfigError(f"{where}.expires: must be an RFC 3339 time with its offset")
    return value


def _vouches(where: str, entry: Mapping[str, Any]) -> bool:
    """``vouches_for_principals``: whether the token vouches for the principals its callers
    declare in ``X-Enode-Principal`` (a trusted bridge, docs/tokens.md#principal); false when left
    out."""
    value = entry.get("vouches_for_principals", False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.vouches_for_principals: must be true or false")
    return value


def _roles(where: str, value: Any) -> frozenset[str]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"{where}.roles: must be a list of roles ({', '.join(ROLES)})")
    for role in value:
        if role not in ALL_ROLES:
            shown = repr(role) if isinstance(role, str) and len(role) <= 50 else "a value"
            raise ConfigError(f"{where}.roles: {shown} is not a role ({', '.join(ROLES)})")
    return frozenset(value)


def _hash(where: str, entry: Mapping[str, Any]) -> tuple[bytes | None, str | None]:
    """Exactly one of ``sha256`` (64 hex digits) and ``argon2`` (a PHC string)."""
    sha, phc = entry.get("sha256"), entry.get("argon2")
    if (sha is None) == (phc is None):
        raise ConfigError(f"{where}: needs exactly one of sha256 and argon2 (the secret's hash)")
    if sha is not None:
        try:
            raw = bytes.fromhex(sha) if isinstance(sha, str) else b""
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise ConfigError(f"{where}.sha256: must be 64 hexadecimal digits")
        return raw, None
    if not isinstance(phc, str) or not phc.startswith("$argon2"):
        raise ConfigError(f"{where}.argon2: must be an argon2 hash ($argon2id$…)")
    try:
        argon2.extract_parameters(phc)
    except argon2.exceptions.InvalidHashError:
        raise ConfigError(f"{where}.argon2: not a valid argon2 hash") from None
    return None, phc


def _nodes(where: str, value: Any, roles: frozenset[str]) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"{where}.nodes: must be a list of node ids (leave it out for any node)")
    for node in value:
        if not isinstance(node, str) or not is_valid_id(node):
            raise ConfigError(f"{where}.nodes: node ids are {NAME_RULE}")
    if not roles & {"node", "operator"}:
        raise ConfigError(f"{where}.nodes: only a token with the node role acts for nodes")
    return frozenset(value)


def _priority(where: str, value: Any, roles: frozenset[str]) -> int:
    """An explicit value beats the role default: 100 for operators, else 0."""
    if value is None:
        return OPERATOR_PRIORITY if "operator" in roles else 0
    low, high = PRIORITY_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{where}.max_priority: must be an integer from {low} to {high}")
    return value


# ------------------------------------------------------------------ new tokens


@dataclass(frozen=True)
class NewToken:
    """A new token: its secret (shown once) and its configuration entry (the hash only)."""

    secret: str
    entry: dict[str, Any]

    @property
    def yaml_entry(self) -> str:
        """The entry as one item of the config file's ``tokens:`` list."""
        return yaml.safe_dump([self.entry], sort_keys=False, default_flow_style=None, width=1000)

    @property
    def json_entry(self) -> str:
        """The entry as one item of the ``MEDIATOR_TOKENS`` JSON list."""
        return json.dumps(self.entry)


def new_token(
    name: str,
    roles: Sequence[str],
    *,
    nodes: Sequence[str] = (),
    principal: str | None = None,
    max_priority: int | None = None,
    team: str | None = None,
    teams: Sequence[str] = (),
) -> NewToken:
    """A random ``med_<id>_<random>`` secret and its entry with that id and an argon2 hash,
    checked as the server will check it (a :class:`ConfigError` names what is wrong)."""
    ident = new_id()
    secret = f"{SECRET_PREFIX}{ident}_{secrets.token_urlsafe(32)}"
    entry: dict[str, Any] = {
        "name": name,
        "id": ident,
        "argon2": _hasher.hash(secret),
        "roles": list(roles),
    }
    if nodes:
        entry["nodes"] = list(nodes)
    if principal is not None:
        entry["principal"] = principal
    if max_priority is not None:
        entry["max_priority"] = max_priority
    if team is not None:
        entry["team"] = team
    if teams:
        entry["teams"] = list(teams)
    parse_token("token", entry)
    return NewToken(secret, entry)


def new_id() -> str:
    """16 random base32 characters (80 bits), lower case."""
    return base64.b32encode(secrets.token_bytes(10)).decode("ascii").lower()[:ID_LENGTH]


def reissued(token: Token) -> NewToken:
    """A new secret with an id for an existing entry (``mediator server token upgrade``): same name,
    roles, principal, nodes, priority, teams and expiry."""
    fresh = new_token(
        token.name,
        sorted(token.roles),
        nodes=sorted(token.nodes or ()),
        principal=token.principal,
        max_priority=token.max_priority,
        team=token.team,
        teams=sorted(token.teams),
    )
    if token.expires is not None:
        fresh.entry["expires"] = token.expires.isoformat()
    return fresh


class FailureLimit:
    """The client addresses this process knows to be over their limit of failed authentications
    (docs/security.md#tokens-and-authentication), until their window ends. The count itself is kept
    in the database, shared by every process (``app.store.auth``); this is only what the process
    learnt from it."""

    def __init__(
        self, limit: int, *, loopback: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit  # 0: no limit
        self.loopback = loopback  # whether loopback addresses are limited too
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def applies_to(self, address: str) -> bool:
        """Loopback addresses (tools on the Mediator's own machine, or a proxy whose
        X-Forwarded-For is not trusted, which would make every client one address) are limited
        only with ``auth.limit_loopback``."""
        if not self.limit:
            return False
        if self.loopback:
            return True
        try:
            return not ipaddress.ip_address(address).is_loopback
        except ValueError:
            return True

    def blocked(self, address: str) -> bool:
        if not self.limit or not self._until:
            return False
        until = self._until.get(address)
        if until is None:
            return False
        if self._clock() < until:
            return True
        with self._lock:
            self._until.pop(address, None)
        return False

    def note(self, address: str, failures: int, seconds_left: float) -> bool:
        """A failure counted: whether this one is already over the limit (answer 429, not 401).
        From the limit-th failure on, the address is blocked in this process for the rest of
        its window."""
        if not self.limit:
            return False
        if failures >= self.limit:
            with self._lock:
                self._until[address] = self._clock() + seconds_left
                if len(self._until) > MAX_REFUSED:  # a flood from many addresses: keep the newest
                    oldest = min(self._until, key=self._until.__getitem__)
                    self._until.pop(oldest, None)
        return failures > self.limit
