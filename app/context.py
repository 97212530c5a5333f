"""What a service function needs, built once per app: configuration, the process's database,
its scan gate, its claim listener and notifier, and the Record store."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from app.config import Config
from app.db import Database, gate_options
from app.healthcheck import load_health_check
from app.listener import ClaimListener, ClaimNotifier
from app.logs import log
from app.metrics import count_auth, count_submits_of
from app.records import FilesystemRecords, RecordStore
from app.services.expected import QueuedShapes
from app.store.gate import ScanGate
from app.store.steps import nodes_with_claimable_steps
from app.teams import Teams
from app.tokens import FailureLimit, TokenSet


class Context:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.db = Database(config)
        idle = config["gate.idle_seconds"]
        self.gate = ScanGate(
            lambda: self.db.dedicated_connection(options=gate_options(idle)),
            idle_seconds=idle,
            deaths=lambda: self.db.deaths,
        )
        self.records: RecordStore = record_store(config)
        self.claims = ClaimListener(
            config, safety_net=self._claimable_nodes, deaths=lambda: self.db.deaths
        )
        self.notifier = ClaimNotifier(
            lambda: self.db.dedicated_connection(name="mediator-notifier")
        )
        # With the process's caches of checked and refused secrets.
        self.tokens = TokenSet.from_config(config, on_count=count_auth)
        self.teams = Teams.from_config(config)  # docs/teams.md
        # docs/operators.md, "Health runs": checked at start-up like a submit.
        self.health_check = load_health_check(
            config["health.check_contract"], config["contract.capabilities"]
        )
        count_submits_of(self.teams.names)
        self.failures = FailureLimit(
            config["auth.max_failures_per_minute"], loopback=config["auth.limit_loopback"]
        )
        # requires_key -> the last submit of that shape found every candidate busy: which
        # statement a submit sends first depends on it, never an outcome (services/submit.py).
        self.queued_shapes: dict[str, bool] = {}
        # The shapes with runs QUEUED, for the expected start (docs/queue.md, "What a QUEUED
        # run's view explains").
        self.estimate_shapes = QueuedShapes()
        # Set when a wake mark could not be taken after a freeing commit: this process owes a
        # mark and a scan, paid at its next successful use of the database
        # (docs/queue.md#which-commit-frees-and-its-mark; app/services/marks.py).
        self.owed = threading.Event()
        # The runs whose promotion raised in this process's last scan with errors: a repeat is
        # not owed again (app/services/queue.py, _new_failures).
        self.failed_promotions: set[str] = set()
        # This process's last reaper pass failed because the database could not be used: the
        # next pass gives every lease a full window first, as after an outage
        # (docs/queue.md#the-reaper).
        self.reaper_lost_database = False
        warn_about_tokens(config, self.tokens)
        warn_of_legacy_vouching(config)

    @property
    def lease_window_seconds(self) -> int:
        """renew × factor: how long an advert keeps a node live and a renewed lease valid."""
        return self.config["lease.renew_seconds"] * self.config["lease.not_after_factor"]

    def _claimable_nodes(self, node_ids: list[str]) -> set[str]:
        """The claims' safety net (docs/design.md#claims-and-the-long-poll): which of these nodes
        have a claimable step."""
        with self.db.read() as s:
            return nodes_with_claimable_steps(s, node_ids)

    def close(self) -> None:
        self.claims.close()
        self.notifier.close()
        self.gate.close()
        self.db.dispose()


def warn_about_tokens(config: Config, tokens: TokenSet) -> None:
    """The start-up's lines about the configured tokens
    (docs/tokens.md#what-a-presented-secret-costs, docs/tokens.md#the-legacy-token,
    docs/security.md#tokens-and-authentication)."""
    if not tokens:
        log.warning("no token is configured (tokens, token): every /v1 request is 401")
    legacy = [t.name for t in tokens.legacy_argon2_tokens]
    if legacy and config["tokens.legacy_argon2"]:
        log.warning(
            "argon2 tokens without an id: every unknown secret is tried against them;"
            " reissue each with `mediator server token upgrade --name NAME`",
            tokens=legacy,
        )
    elif legacy:
        log.warning(
            "argon2 tokens without an id are refused (tokens.legacy_argon2 is false);"
            " reissue each with `mediator server token upgrade --name NAME`",
            tokens=legacy,
        )
    if config["token"] and config["token_allow_short"] and len(config["token"]) < 32:
        log.warning("the legacy token is shorter than 32 characters (token_allow_short)")


def record_store(config: Config) -> RecordStore:
    """The configured Record store backend (``records.backend``)."""
    if config["records.backend"] == "s3":
        from app.records.s3 import S3Records  # boto3 is only needed for this backend

        return S3Records(
            config["records.s3.bucket"],
            config["records.s3.prefix"] or "",
            endpoint_url=config["records.s3.endpoint_url"],
        )
    records = FilesystemRecords(config["records.root"])
    # a ConfigError naming records.root, docs/configuration.md#where-records-are-kept
    records.refuse_case_insensitive_root()
    return records


def check_record_store(config: Config) -> None:
    """What start-up checks of the Record store before any worker serves (gunicorn's master): a
    filesystem root that ignores case is a :class:`ConfigError` naming ``records.root``
    (docs/configuration.md#where-records-are-kept). Every process that builds a :class:`Context`
    checks it again."""
    if config["records.backend"] != "s3":
        FilesystemRecords(config["records.root"]).refuse_case_insensitive_root()


def warn_of_legacy_vouching(config: Config) -> None:
    """The legacy token (docs/tokens.md#the-legacy-token) vouches for whatever principal its callers
    declare (the original's runctl answers restricted asks with it); beside other tokens that is
    worth a line."""
    if config["token"] and config["tokens"]:
        log.warning(
            "the legacy token vouches for every principal its callers declare, beside "
            f"{len(config['tokens'])} other tokens: answers to restricted asks made with it are "
            "taken as from the principal they name"
        )


@dataclass(frozen=True)
class Caller:
    """Who acts: the token's name and roles, and the principal (the token's own, or the
    ``X-Enode-Principal`` header taken as given: ``principal_declared``).

    A principal (docs/tokens.md#principal) is vouched for — the token's own, or declared through a
    token that vouches for its callers (``vouches``: a trusted bridge, the legacy token) — or
    marked: a self-declared principal is recorded with the token's name beside it
    (``declared_token``)."""

    token_name: str
    roles: frozenset[str]
    principal: str | None
    # a node token bound to these node ids (docs/tokens.md#node-binding)
    nodes: frozenset[str] | None = None
    max_priority: int = 0  # the highest queue priority the token may ask for
    principal_declared: bool = True  # False when the principal is the token's own
    vouches: bool = False  # the token vouches for the principals its callers declare
    team: str | None = None  # the token's default team (docs/teams.md)
    teams: frozenset[str] = frozenset()  # the other teams its contracts may name

    @property
    def by(self) -> str:
        return self.principal or self.token_name

    @property
    def self_declared(self) -> bool:
        """The principal came from the ``X-Enode-Principal`` header, not from the token."""
        return self.principal_declared and self.principal is not None

    @property
    def vouched(self) -> bool:
        """There is a principal and the token vouches for it: what a restricted ask needs."""
        return self.principal is not None and (not self.principal_declared or self.vouches)

    @property
    def declared_token(self) -> str | None:
        """The token's name when the principal is self-declared (recorded beside it), else None."""
        return self.token_name if self.self_declared else None
