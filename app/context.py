"""What a service function needs, built once per app: configuration, the process's database,
its scan gate and the Record store."""

from __future__ import annotations

from dataclasses import dataclass

from app.config import Config
from app.db import Database
from app.listener import ClaimListener
from app.logs import log
from app.records import FilesystemRecords, RecordStore
from app.store.gate import ScanGate
from app.tokens import TokenSet


class Context:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.db = Database(config)
        self.gate = ScanGate(self.db.dedicated_connection)
        self.records: RecordStore = record_store(config)
        self.claims = ClaimListener(config)
        self.tokens = TokenSet.from_config(config)  # with the process's cache of checked secrets
        if not self.tokens:
            log.warning("no token is configured (tokens, token): every /v1 request is 401")

    @property
    def lease_window_seconds(self) -> int:
        """renew × factor: how long an advert keeps a node live and a renewed lease valid."""
        return self.config["lease.renew_seconds"] * self.config["lease.not_after_factor"]

    def close(self) -> None:
        self.claims.close()
        self.gate.close()
        self.db.dispose()


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
    records.refuse_case_insensitive_root()  # SPEC §20.2: a ConfigError naming records.root
    return records


def check_record_store(config: Config) -> None:
    """What start-up checks of the Record store before any worker serves (gunicorn's master): a
    filesystem root that ignores case is a :class:`ConfigError` naming ``records.root`` (SPEC
    §20.2). Every process that builds a :class:`Context` checks it again."""
    if config["records.backend"] != "s3":
        FilesystemRecords(config["records.root"]).refuse_case_insensitive_root()


@dataclass(frozen=True)
class Caller:
    """Who acts: the token's name and roles, and the principal (the token's own, or the
    ``X-Enode-Principal`` header taken as given: ``principal_declared``)."""

    token_name: str
    roles: frozenset[str]
    principal: str | None
    nodes: frozenset[str] | None = None  # a node token bound to these node ids (SPEC §13)
    max_priority: int = 0  # the highest queue priority the token may ask for
    principal_declared: bool = True  # False when the principal is the token's own

    @property
    def by(self) -> str:
        return self.principal or self.token_name
