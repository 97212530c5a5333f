"""Configuration: defaults, a YAML/TOML file, ``MEDIATOR_*`` environment variables
(docs/configuration.md#keys).

The environment wins over the file, and the environment alone is a complete configuration. Keys are
flat dotted names (``lease.ttl_seconds``); a file may nest them (``lease: {ttl_seconds: 60}``). Each
key's variable is ``MEDIATOR_`` + the key upper-cased with dots as underscores; ``DATABASE_URL`` is
accepted for ``database.url``. An invalid value raises :class:`ConfigError` with one line naming the key;
a ``MEDIATOR_*`` variable that nothing reads is a warning naming it.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
from psycopg.conninfo import conninfo_to_dict

from app.config_loader import (
    FileMessages,
    as_bool,
    as_float,
    as_int,
    as_str,
    as_str_list,
    coerce,
    from_environment,
    one_of,
    read_mapping,
)
from app.errors import ConfigError
from app.logs import configure_logging, log
from app.teams import Team, Teams, check_token_teams, parse_teams
from app.tokens import Token, parse_tokens


@dataclass(frozen=True)
class Key:
    name: str
    default: Any
    parse: Callable[[str, Any], Any]
    check: Callable[[Any], str | None] = lambda v: None
    # never echo the value: tokens, URLs with passwords (docs/security.md#tokens-and-authentication)
    secret: bool = False

    @property
    def env(self) -> str:
        return "MEDIATOR_" + self.name.upper().replace(".", "_")


def _tokens(name: str, v: Any) -> tuple[Token, ...]:
    return parse_tokens(name, v)  # a wrong entry is a ConfigError naming it and its field


def _teams(name: str, v: Any) -> tuple[Team, ...]:
    return parse_teams(name, v)  # docs/teams.md; a wrong entry names it and its field


def _database_url(name: str, v: Any) -> str | None:
    """A ``postgresql://`` URL (several hosts allowed) or a libpq keyword string
    (``host=h1,h2 port=5432,5432 dbname=db``); docs/deploy.md#11-a-database-with-a-standby."""
    url = as_str(name, v)
    if url is None:
        return None
    if "://" in url:
        scheme = url.split("://", 1)[0]
        if scheme not in {"postgresql", "postgres", "postgresql+psycopg"}:
            raise ValueError("must be a postgresql:// URL or a libpq keyword string")
    try:
        conninfo_to_dict(to_libpq_url(url))
    except psycopg.Error:
        # Not libpq's reason: it quotes the part it could not read, which may be a password's.
        raise ValueError("must be a postgresql:// URL or a libpq keyword string") from None
    return url


def _positive(v: Any) -> str | None:
    return None if v > 0 else "must be greater than 0"


def _not_negative(v: Any) -> str | None:
    return None if v >= 0 else "must not be negative"


def _fraction(v: Any) -> str | None:
    return None if 0 <= v < 1 else "must be at least 0 and below 1"


def _at_least_one(v: Any) -> str | None:
    return None if v >= 1 else "must be at least 1"


KEYS: tuple[Key, ...] = (
    Key("database.url", None, _database_url, secret=True),
    Key("database.pool_size", 5, as_int, _at_least_one),
    Key("database.pool_timeout", 5.0, as_float, _positive),
    Key("database.statement_timeout_seconds", 10.0, as_float, _positive),
    Key("records.root", "./var/records", as_str),
    # Where the Records live: a local directory (records.root) or an S3-compatible bucket, which
    # several hosts need. The store's credentials come from the AWS chain, never from here.
    Key("records.backend", "filesystem", as_str, one_of("filesystem", "s3")),
    Key("records.s3.bucket", None, as_str),
    Key("records.s3.prefix", None, as_str),
    Key("records.s3.endpoint_url", None, as_str),
    # What the steps of one run may store, at most (docs/security.md#runs-records-and-uploads):
    # bytes of every file a node uploaded (logs, their progress, blobs), and distinct files of one
    # step.
    Key("records.max_run_bytes", 1 << 30, as_int, _at_least_one),
    Key("records.max_step_files", 1000, as_int, _at_least_one),
    Key("max_blob_bytes", 10 * 1024 * 1024, as_int, _positive),
    Key("max_body_bytes", 1024 * 1024, as_int, _positive),
    Key("claim.long_poll_seconds", 30.0, as_float, _not_negative),
    Key("claim.recheck_seconds", 5.0, as_float, _positive),
    # A claim that finds nothing is held for the window minus a random share of up to this
    # fraction of it, so a fleet whose claims started together (a restart, a deploy) does not
    # end them together and send every first look of the next window at once.
    Key("claim.long_poll_jitter", 0.25, as_float, _fraction),
    # The scan gate's session is dropped by PostgreSQL after this long idle, and a stalled
    # scanner loses its turn: the longest a hung process keeps every other from scanning.
    Key("gate.idle_seconds", 30.0, as_float, _positive),
    Key("lease.ttl_seconds", 3600, as_int, _positive),
    Key("lease.renew_seconds", 60, as_int, _positive),
    Key("lease.not_after_factor", 3, as_int, _at_least_one),
    Key("lease.max_per_run", 0, as_int, _not_negative),
    # A QUEUED run waiting this long reserves the nodes it needs (0: no reservations).
    Key("queue.reserve_after_seconds", 900, as_int, _not_negative),
    # The runs ahead one request may look at for the expected starts it shows
    # (docs/queue.md, "What a QUEUED run's view explains").
    Key("estimate.max_ahead", 200, as_int, _not_negative),
    # Fair share among teams (docs/teams.md, "Fair share"): the half-life of a team's usage, and
    # what each node its runs hold counts for in the order before its usage has moved.
    Key("fairshare.half_life_seconds", 86400, as_int, _positive),
    Key("fairshare.running_charge_seconds", 3600, as_int, _not_negative),
    # Broken boards (docs/operators.md, "Quarantine"): strikes in a row that quarantine a node
    # (0: never), the contract of the health run that lifts a quarantine (a JSON file), and how
    # long after a failed health run the next is queued.
    Key("health.failures_in_a_row", 3, as_int, _not_negative),
    Key("health.check_contract", None, as_str),
    Key("health.recheck_seconds", 3600, as_int, _positive),
    Key("notify.nodes_url", None, as_str),
    Key("notify.asks_url", None, as_str),
    Key("notify.runs_url", None, as_str),
    # Webhooks waiting for a sender, at most: past it they are dropped and counted.
    Key("notify.queue_size", 1000, as_int, _at_least_one),
    Key("notify.timeout_seconds", 3.0, as_float, _positive),
    Key("contract.capabilities", (), as_str_list),
    Key("tokens", (), _tokens, secret=True),
    # docs/teams.md: who shares the fleet; without it every run is team "default".
    Key("teams", (), _teams),
    Key("token", None, as_str, secret=True),
    # argon2 entries without an id are tried for secrets no id or sha256 names (one release more).
    Key("tokens.legacy_argon2", True, as_bool),
    # A legacy token shorter than 32 characters is refused unless this is set (then it warns).
    Key("token_allow_short", False, as_bool),
    # Slow (argon2) verifications at once per process; more wait up to database.pool_timeout.
    Key("auth.slow_concurrency", 2, as_int, _at_least_one),
    # Failed authentications from one address in a minute before it is answered 429 (0: never).
    Key("auth.max_failures_per_minute", 30, as_int, _not_negative),
    # Whether that limit also holds for loopback addresses (local tools; a proxy not trusted).
    Key("auth.limit_loopback", False, as_bool),
    # Proxies in front of the Mediator whose X-Forwarded-For names the client (nginx: 1).
    Key("http.trusted_proxies", 0, as_int, _not_negative),
    Key("metrics.require_token", False, as_bool),
    Key("ui.require_token", False, as_bool),
    # The pages' sessions (docs/pages.md#signing-in): how long a sign-in lasts, and a cookie without
    # Secure (plain HTTP on a developer's machine: `mediator demo`).
    Key("ui.session_hours", 12.0, as_float, _positive),
    Key("ui.insecure_cookie", False, as_bool),
    # Where people reach the pages: ask notifications carry a page_url under it.
    Key("ui.public_url", None, as_str),
    # Finished runs older than this many days are pruned by the reaper; 0 keeps every run.
    Key("retention.days", 0, as_int, _not_negative),
    Key("log.format", "json", as_str, one_of("json", "console")),
    Key("log.level", "info", as_str, one_of("debug", "info", "warning", "error")),
)
KEYS_BY_NAME = {k.name: k for k in KEYS}
ENV_VARIABLES = {k.name: (k.env,) for k in KEYS}


class Config(Mapping[str, Any]):
    """A validated, read-only mapping of dotted keys to values."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def database_url(self) -> str:
        """``database.url`` as configured (any form libpq takes); a ConfigError when unset."""
        url = self["database.url"]
        if url is None:
            raise ConfigError("database.url: not set (MEDIATOR_DATABASE_URL or DATABASE_URL)")
        return str(url)


def to_libpq_url(url: str) -> str:
    """The plain libpq form of a URL, for psycopg connections outside SQLAlchemy:
    ``postgresql+psycopg://…`` (SQLAlchemy's form) and ``postgres://…`` become ``postgresql://…``;
    any other URL is returned as it is."""
    scheme, sep, rest = url.partition("://")
    if sep and (
        scheme in {"postgresql", "postgres"} or scheme.startswith(("postgresql+", "postgres+"))
    ):
        return "postgresql://" + rest
    return url


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested file sections to dotted keys; a dotted key in the file is taken as it is."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and name not in KEYS_BY_NAME:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


FILE_MESSAGES = FileMessages(
    cannot_read="config: cannot read {path}: {reason}",
    cannot_parse="config: cannot parse {path}: {reason}",
    not_a_mapping="config: {path} must hold a mapping of keys",
)


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The keys of a YAML or TOML configuration file (by its suffix), flattened."""
    return flatten(read_mapping(path, FILE_MESSAGES, ConfigError))


# MEDIATOR_* variables read outside the configuration keys: the config file's name, gunicorn's
# settings (gunicorn.conf.py), the throwaway PostgreSQL's user, fault points of the crash tests,
# the databases of the test suite and the benchmarks, and the settings of the client commands
# (app/client/settings.py) and of the node agent (app/agent/config.py). The older shared
# MEDIATOR_URL and MEDIATOR_PRINCIPAL are read by both; MEDIATOR_TOKEN too, and it is also this
# server's `token` key: the client's and the agent's own names keep their tokens out of a server
# started from the same shell.
OTHER_VARIABLES = frozenset(
    {
        "MEDIATOR_CONFIG",
        "MEDIATOR_URL",
        "MEDIATOR_PRINCIPAL",
        "MEDIATOR_CLIENT_URL",
        "MEDIATOR_CLIENT_TOKEN",
        "MEDIATOR_CLIENT_PRINCIPAL",
        "MEDIATOR_CLIENT_PROFILE",
        "MEDIATOR_CLIENT_CONFIG",
        "MEDIATOR_AGENT_URL",
        "MEDIATOR_AGENT_TOKEN",
        "MEDIATOR_AGENT_PRINCIPAL",
        "MEDIATOR_BIND",
        "MEDIATOR_WORKERS",
        "MEDIATOR_THREADS",
        "MEDIATOR_WORKER_TIMEOUT",
        "MEDIATOR_WORKER_CONNECTIONS",
        "MEDIATOR_GRACEFUL_TIMEOUT",
        "MEDIATOR_EMBEDDED_PG_USER",
        "MEDIATOR_FAULT",
        "MEDIATOR_TEST_DATABASE_URL",
        "MEDIATOR_DEVDB_TEST_URL",
        "MEDIATOR_BENCH_DATABASE_URL",
    }
)


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """The ``MEDIATOR_*`` variables of ``env`` that no key and nothing else of the Mediator reads,
    sorted: a mistyped name would otherwise go unnoticed."""
    known = {key.env for key in KEYS} | OTHER_VARIABLES
    return sorted(name for name in env if name.startswith("MEDIATOR_") and name not in known)


def _warn_unknown_variables(env: Mapping[str, str], values: Mapping[str, Any]) -> None:
    """One warning per unknown ``MEDIATOR_*`` variable, naming it and the closest known one. A
    process that has not configured its logs yet gets them configured first, so the line comes
    out in the configured format like every other (start-up loads the configuration first)."""
    unknown = unknown_variables(env)
    if not unknown:
        return
    if not structlog.is_configured():
        configure_logging(values["log.format"], values["log.level"])
    known = sorted({key.env for key in KEYS} | OTHER_VARIABLES)
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        log.warning(
            "unknown environment variable, ignored",
            variable=name,
            did_you_mean=close[0] if close else None,
        )


# The variables of the token keys. A gunicorn master keeps the environment it started with, and a
# reload (HUP) starts workers in it: tokens there are not read again until a restart, where the
# configuration file is read again by every new worker (docs/tokens.md, "Changing tokens").
TOKEN_VARIABLES = (KEYS_BY_NAME["tokens"].env, KEYS_BY_NAME["token"].env)


def warn_of_tokens_in_environment(env: Mapping[str, str] | None = None) -> None:
    """One warning naming the token variables ``env`` sets (set empty too: that clears the
    file's key), said by gunicorn's master when it starts and at every reload."""
    env = os.environ if env is None else env
    found = [name for name in TOKEN_VARIABLES if name in env]
    if found:
        log.warning(
            "tokens in the environment are read only when the service starts: a reload keeps"
            " them (a token removed there works until a restart) and they hide the"
            " configuration file's; keep tokens in the file, which a reload reads again",
            variables=found,
        )


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    only: Collection[str] | None = None,
) -> Config:
    """Defaults < file (``path`` or ``MEDIATOR_CONFIG``) < environment < ``overrides`` (tests).
    ``only``: just these keys, checked one by one, for a command that works offline (``mediator
    validate``): the rest of the server's configuration (its tokens, its teams, keys a newer
    Mediator knows) is neither read nor judged."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    path = path or env.get("MEDIATOR_CONFIG") or None
    if path:
        raw.update(read_file(path))
    # DATABASE_URL only when not empty; a MEDIATOR_* variable set empty clears its key.
    variables = [({"database.url": ("DATABASE_URL",)}, True), (ENV_VARIABLES, False)]
    for names, empty_is_unset in variables:
        found = from_environment(env, names, empty_is_unset=empty_is_unset)
        raw.update((key, value) for key, (value, _) in found.items())
    if overrides:
        raw.update(flatten(overrides))
    if only is not None:
        return Config(_checked(raw, [KEYS_BY_NAME[name] for name in only]))
    unknown = sorted(set(raw) - set(KEYS_BY_NAME))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown configuration key")
    values = _checked(raw, KEYS)
    if values["records.backend"] == "s3" and not values["records.s3.bucket"]:
        raise ConfigError("records.s3.bucket: must be set when records.backend is s3")
    _check_legacy_token(values)
    check_token_teams(values["tokens"], Teams(values["teams"]))
    _warn_unknown_variables(env, values)
    return Config(values)


def _checked(raw: Mapping[str, Any], keys: Iterable[Key]) -> dict[str, Any]:
    """Each of ``keys``: its raw value parsed and checked (a ConfigError naming the key), or its
    default."""
    values: dict[str, Any] = {}
    for key in keys:
        value = raw.get(key.name, key.default)
        if value is not key.default or key.name in raw:
            shown = "" if key.secret else f" (got {value!r})"
            value = coerce(key.name, value, key.parse, ConfigError, shown=shown)
            problem = key.check(value) if value is not None else None
            if problem:
                raise ConfigError(f"{key.name}: {problem}{shown}")
        values[key.name] = value
    return values


# The legacy token of the deploy samples: a server started with it would accept a published secret.
PLACEHOLDER_TOKENS = frozenset({"change-me-to-a-long-random-secret", "change-me"})
SHORT_TOKEN = 32  # characters: a legacy token shorter than this needs token_allow_short


def _check_legacy_token(values: Mapping[str, Any]) -> None:
    """The sample's placeholder is always refused (docs/security.md#tokens-and-authentication); a
    short legacy token only with ``token_allow_short`` (and then every start warns, see
    :func:`app.context.Context`)."""
    token = values["token"]
    if token is None:
        return
    if token in PLACEHOLDER_TOKENS:
        raise ConfigError("token: the sample's placeholder; set a long random secret")
    if len(token) < SHORT_TOKEN and not values["token_allow_short"]:
        raise ConfigError(
            f"token: shorter than {SHORT_TOKEN} characters (set token_allow_short: true to allow)"
        )
