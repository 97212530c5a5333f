"""Bearer tokens and their roles: the configured list, its validation, the check of a presented
secret, and new tokens for ``mediator token new``.

A token in the configuration is ``{name, sha256 | argon2, roles, principal?, nodes?,
max_priority?}``: the secret itself is never stored, only its SHA-256 (hex) or an argon2 hash (the
PHC string ``$argon2id$…``). The legacy single ``token`` is one token named ``token`` with every
role. A presented secret is checked against every hash once per process: the token it matches is
kept by the SHA-256 of the secret, so argon2's deliberate slowness is paid once per token, not on
every request. Nothing here depends on Flask.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import argon2
import yaml

from app.contract.fields import is_valid_id
from app.errors import ConfigError

ROLES = ("submitter", "node", "answerer", "reader", "operator")
ALL_ROLES = frozenset(ROLES)
LEGACY_NAME = "token"  # the name of the legacy single token: on runs, in logs and events
OPERATOR_PRIORITY = 100  # the max_priority of operators and of the legacy token by default
PRIORITY_RANGE = (-100, 100)
FIELDS = (
    "name",
    "sha256",
    "argon2",
    "roles",
    "principal",
    "nodes",
    "max_priority",
    "vouches_for_principals",
)
MAX_REFUSED = 1024  # refused secrets remembered per process (a misconfigured agent retrying)

_hasher = argon2.PasswordHasher()


@dataclass(frozen=True)
class Token:
    """One configured token. ``nodes`` None: any node; ``principal`` None: the caller's
    ``X-Enode-Principal`` header is taken as given (self-declared)."""

    name: str
    roles: frozenset[str]
    principal: str | None = None
    # SPEC §20.5: a trusted bridge; the principals its callers declare may answer restricted asks.
    vouches_for_principals: bool = False
    nodes: frozenset[str] | None = None
    max_priority: int = 0
    sha256: bytes | None = None  # the digest of the secret
    argon2: str | None = None  # the PHC string of the secret's argon2 hash

    def __repr__(self) -> str:  # the hashes stay out of every log line and traceback
        return f"Token(name={self.name!r}, roles={sorted(self.roles)!r})"


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


class TokenSet:
    """The tokens a process accepts, and which presented secrets it has already checked.

    Correctness never depends on the cache: a cached entry is a token of this process's own
    configuration, which does not change while it runs."""

    def __init__(self, tokens: Iterable[Token]) -> None:
        self.tokens: tuple[Token, ...] = tuple(tokens)
        self._verified: dict[bytes, Token] = {}
        self._refused: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TokenSet:
        """``tokens`` and the legacy ``token`` side by side."""
        tokens = list(config["tokens"])
        if config["token"]:
            tokens.append(legacy_token(config["token"]))
        return cls(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def verify(self, secret: str) -> Token | None:
        """The token whose secret ``secret`` is, or None. Every hash is checked (no early exit on
        the cheap ones, so the time says nothing about which matched), once per secret and
        process."""
        if not secret:
            return None
        key = digest(secret)
        hit = self._verified.get(key)
        if hit is not None:
            return hit
        if key in self._refused:
            return None
        found: Token | None = None
        for token in self.tokens:
            if check_secret(token, secret, key) and found is None:
                found = token
        with self._lock:
            if found is not None:
                self._verified[key] = found  # at most one entry per configured token
            else:
                self._refused[key] = None
                while len(self._refused) > MAX_REFUSED:
                    self._refused.popitem(last=False)
        return found


def legacy_token(secret: str) -> Token:
    """The legacy single ``token``: every role, max_priority 100, for the original clients."""
    return Token(
        name=LEGACY_NAME,
        roles=ALL_ROLES,
        max_priority=OPERATOR_PRIORITY,
        sha256=digest(secret),
        # SPEC §20.5: the original's runctl answers restricted asks with it, naming the principal.
        vouches_for_principals=True,
    )


# ------------------------------------------------------------------ the configured list


def parse_tokens(key: str, entries: Any) -> tuple[Token, ...]:
    """The ``tokens`` list of the configuration (file entries, or the JSON of
    ``MEDIATOR_TOKENS``) as :class:`Token` objects. A wrong entry raises :class:`ConfigError`,
    one line naming the entry and its field (``tokens[1].roles: …``), never a hash."""
    if isinstance(entries, str):
        try:
            entries = json.loads(entries) if entries.strip() else []
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{key}: must be a JSON list ({exc.msg})") from None
    if not isinstance(entries, (list, tuple)):
        raise ConfigError(f"{key}: must be a list of tokens")
    tokens: list[Token] = []
    names: set[str] = set()
    hashes: set[bytes] = set()
    for i, entry in enumerate(entries):
        # An entry already parsed (a configuration handed on as its values) is kept as it is.
        token = entry if isinstance(entry, Token) else parse_token(f"{key}[{i}]", entry)
        if token.name in names:
            raise ConfigError(f"{key}[{i}].name: {token.name!r} is the name of an earlier token")
        if token.sha256 is not None and token.sha256 in hashes:
            raise ConfigError(f"{key}[{i}].sha256: the same secret as an earlier token")
        names.add(token.name)
        if token.sha256 is not None:
            hashes.add(token.sha256)
        tokens.append(token)
    return tuple(tokens)


def parse_token(where: str, entry: Any) -> Token:
    """One entry of ``tokens``; ``where`` names it in errors (``tokens[0]``)."""
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: must be a mapping of {', '.join(FIELDS)}")
    unknown = sorted(str(k) for k in entry if k not in FIELDS)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown field (fields: {', '.join(FIELDS)})")
    name = entry.get("name")
    if not isinstance(name, str) or not is_valid_id(name):
        raise ConfigError(f"{where}.name: must be 1-200 characters of [A-Za-z0-9._:@-]")
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
    )


def _vouches(where: str, entry: Mapping[str, Any]) -> bool:
    """``vouches_for_principals``: whether the token vouches for the principals its callers
    declare in ``X-Enode-Principal`` (a trusted bridge, SPEC §20.5); false when left out."""
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
            raise ConfigError(f"{where}.nodes: node ids are 1-200 characters of [A-Za-z0-9._:@-]")
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
) -> NewToken:
    """A random secret and its entry with an argon2 hash, checked as the server will check it
    (a :class:`ConfigError` names what is wrong)."""
    secret = secrets.token_urlsafe(32)
    entry: dict[str, Any] = {"name": name, "argon2": _hasher.hash(secret), "roles": list(roles)}
    if nodes:
        entry["nodes"] = list(nodes)
    if principal is not None:
        entry["principal"] = principal
    if max_priority is not None:
        entry["max_priority"] = max_priority
    parse_token("token", entry)
    return NewToken(secret, entry)
