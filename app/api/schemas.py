"""Marshmallow schemas of the request and response bodies; the OpenAPI document is generated from
them (route 21). Request schemas validate; response schemas document what the services return."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from marshmallow import (
    EXCLUDE,
    RAISE,
    Schema,
    ValidationError,
    fields,
    post_load,
    pre_load,
    validate,
)

from app.contract import is_valid_id
from app.contract.fields import FORMAT_CHARACTERS
from app.estimate import BASES
from app.names import (
    CAPABILITY_PATTERN,
    CAPABILITY_RE,
    MAX_NAME,
    NAME_CHARACTERS,
    NAME_CHARACTERS_BUT_DOT,
    NAME_RE,
    NAME_RULE,
)
from app.teams import NAME_PATTERN as TEAM_NAME_PATTERN
from app.teams import NAME_RULE as TEAM_NAME_RULE
from app.wire import parse_ts


class Whole(validate.Regexp):
    """``validate.Regexp`` matched against the whole string. Its own ``re.match`` with ``^…$``
    takes ``"n1\\n"``: ``$`` also matches before a trailing newline, and such a node id could be
    leased but never claim. The pattern keeps its anchors for the OpenAPI document, whose
    (ECMAScript) ``$`` means the end."""

    def __call__(self, value: Any) -> Any:
        if self.regex.fullmatch(value) is None:
            raise ValidationError(self._format_error(value))
        return value


# A name's and a capability's characters (one definition, app/contract/fields.py), shared by the
# schemas and the advert's fast path.
NAME = [validate.Length(min=1, max=MAX_NAME), Whole(f"^{NAME_CHARACTERS}+$")]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT64_ERROR = "must be a signed 64-bit integer, got {input}"
CAPABILITY = [
    validate.Length(min=1, max=MAX_NAME),
    Whole(f"^{CAPABILITY_PATTERN}$"),
]


_REPLACED = re.compile(f"[\x00\ud800-\udfff{FORMAT_CHARACTERS}]")


def replaced_text(value: Any) -> Any:
    """Every NUL in the strings of a JSON value (keys included) as U+FFFD
    (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl), and every lone
    surrogate (JSON's ``"\\ud800"``) too: PostgreSQL can store neither. Every Unicode format
    character as well (docs/security.md#input-and-load): a bidi override in a label or an error
    would make the text shown to people read otherwise than it is."""
    if isinstance(value, str):
        return _REPLACED.sub("\ufffd", value)
    if isinstance(value, list):
        return [replaced_text(v) for v in value]
    if isinstance(value, dict):
        return {replaced_text(k): replaced_text(v) for k, v in value.items()}
    return value


class AgentBody(Schema):
    """What a node agent sends is never refused for its text: a NUL or a format character becomes
    U+FFFD first."""

    @pre_load
    def _replaced_text(self, data: Any, **_: Any) -> Any:
        return replaced_text(data)


class CapabilitySchema(Schema):
    class Meta:
        unknown = EXCLUDE

    capability = fields.String(required=True, validate=CAPABILITY)
    # ``attrs: null`` is ``{}`` (docs/api.md#post-v1nodes--advertise-the-heartbeat).
    attrs = fields.Dict(
        keys=fields.String(validate=validate.Length(min=1, max=200)),
        values=fields.String(validate=validate.Length(max=1024)),
        load_default=dict,
        allow_none=True,
    )


class PolicySchema(Schema):
    class Meta:
        unknown = EXCLUDE

    # Any value is taken and an unknown one folded to "" by the service
    # (docs/queue.md#heartbeats-what-a-node-learns).
    drain = fields.Raw(load_default="", allow_none=True)


class NodeAdvertSchema(AgentBody):
    """``POST /v1/nodes``; extra fields of older agents are ignored. ``capabilities: null`` is no
    capabilities: the advert is taken and leases renew, the node gets no new work
    (docs/api.md#post-v1nodes--advertise-the-heartbeat)."""

    class Meta:
        unknown = EXCLUDE

    node_id = fields.String(
        required=True, validate=NAME, error_messages={"required": "node_id is missing"}
    )
    label = fields.String(allow_none=True, validate=validate.Length(max=200))
    instance = fields.String(allow_none=True, validate=validate.Length(max=200))
    capabilities = fields.List(
        fields.Nested(CapabilitySchema),
        load_default=list,
        allow_none=True,
        validate=validate.Length(max=100),
    )
    policy = fields.Nested(PolicySchema, allow_none=True)

    def fast_load(self, data: Any) -> dict[str, Any] | None:
        """What :meth:`load` returns for an advert of the usual shape (known fields only, each of
        its type and within its bounds, no text to replace), built without marshmallow's field
        machinery, which cost a heartbeat a fifth of its CPU; None for any other body, which
        :meth:`load` then takes (and refuses, naming the field) as always. The two agree on
        every body this accepts (tests/unit/test_advert_fast_load.py)."""
        if type(data) is not dict or not data.keys() <= _ADVERT_KEYS:
            return None
        node_id = data.get("node_id")
        if type(node_id) is not str or not NAME_RE.fullmatch(node_id):
            return None
        loaded: dict[str, Any] = {"node_id": node_id}
        for key in ("label", "instance"):
            if key in data:
                value = data[key]
                if value is not None and not _plain_text(value, 200):
                    return None
                loaded[key] = value
        capabilities = data.get("capabilities", [])
        if capabilities is not None:
            if type(capabilities) is not list or len(capabilities) > 100:
                return None
            entries = [_fast_capability(entry) for entry in capabilities]
            if None in entries:
                return None
            capabilities = entries
        loaded["capabilities"] = capabilities
        if "policy" in data:
            policy = data["policy"]
            if policy is not None:
                if type(policy) is not dict or not policy.keys() <= {"drain"}:
                    return None
                drain = policy.get("drain", "")
                if drain is not None and not _plain_text(drain, None):
                    return None
                policy = {"drain": drain}
            loaded["policy"] = policy
        return loaded


_ADVERT_KEYS = frozenset({"node_id", "label", "instance", "capabilities", "policy"})


def _plain_text(value: Any, max_length: int | None) -> bool:
    """A string within ``max_length`` characters with nothing :func:`replaced_text` replaces."""
    return (
        type(value) is str
        and (max_length is None or len(value) <= max_length)
        and _REPLACED.search(value) is None
    )


def _fast_capability(entry: Any) -> dict[str, Any] | None:
    """One entry of :meth:`NodeAdvertSchema.fast_load`'s capabilities, as
    :class:`CapabilitySchema` loads it; None: not of the usual shape."""
    if type(entry) is not dict or not entry.keys() <= {"capability", "attrs"}:
        return None
    name = entry.get("capability")
    if type(name) is not str or not CAPABILITY_RE.fullmatch(name):
        return None
    attrs = entry.get("attrs", {})
    if attrs is not None:
        if type(attrs) is not dict:
            return None
        for key, value in attrs.items():
            if not (key and _plain_text(key, 200) and _plain_text(value, 1024)):
                return None
        attrs = dict(attrs)
    return {"capability": name, "attrs": attrs}


class Reply(Schema):
    """A response body. Fields the Mediator adds later may appear: clients ignore what they do
    not know."""

    class Meta:
        unknown = EXCLUDE


# A principal declared in X-Enode-Principal under a token without one of its own is marked.
_SELF_DECLARED = (
    "true when {what} was declared in X-Enode-Principal under a token without a principal of its "
    "own (then token names that token); absent for a token's own principal"
)
_TOKEN = "the name of the token a self-declared principal came with (only beside a *_self_declared)"


def _ts(**kw: Any) -> fields.String:
    return fields.String(metadata={"format": "date-time", **kw.pop("metadata", {})}, **kw)


class LeaseSchema(Reply):
    run_id = fields.String(required=True)
    node = fields.String(required=True)
    capability = fields.String(required=True, allow_none=True)
    not_after = _ts(required=True, allow_none=True)
    nonce = fields.String(required=True, allow_none=True)


class AdvertReplySchema(Reply):
    leases = fields.List(fields.Nested(LeaseSchema), required=True)
    renew_seconds = fields.Integer(required=True)
    drain = fields.String(required=True)


class AssignedNodeSchema(Reply):
    node = fields.String(required=True)
    label = fields.String(required=True, allow_none=True)


class AssignedSchema(Reply):
    as_ = fields.String(data_key="as", required=True)
    nodes = fields.List(fields.Nested(AssignedNodeSchema), required=True)


class StepViewSchema(Reply):
    seq = fields.Integer(required=True)
    id = fields.String(required=True)
    kind = fields.String(required=True, validate=validate.OneOf(["run", "agent", "ask", "acquire"]))
    state = fields.String(required=True)
    uses = fields.String()
    node = fields.String()
    needs = fields.List(fields.String(), required=True)
    attempt = fields.Integer(metadata={"description": "0-based; omitted when 0"})
    chosen = fields.Boolean(required=True)
    started_at = _ts()
    ended_at = _ts()
    error = fields.String()
    exit_code = fields.Integer()


class CandidatesSchema(Reply):
    live = fields.Integer(required=True)
    busy = fields.Integer(required=True)
    draining = fields.Integer(required=True)
    quarantined = fields.Integer(
        metadata={"description": "live, not busy, not draining, quarantined (docs/operators.md)"}
    )
    reserved = fields.Integer(
        metadata={"description": "reserved against this run (docs/priorities.md#what-you-see)"}
    )


class RoleViewSchema(Reply):
    """A role as the run view shows it: attributes nested; while QUEUED, its candidates."""

    as_ = fields.String(data_key="as", required=True)
    capability = fields.String(required=True)
    count = fields.Integer()
    attrs = fields.Dict(keys=fields.String(), values=fields.String(), required=True)
    candidates = fields.Nested(CandidatesSchema)
    held_by = fields.List(fields.String(), metadata={"description": "runs holding busy nodes"})
    reserved_by = fields.List(
        fields.String(), metadata={"description": "runs holding reservations against this run"}
    )


class QueuePlaceSchema(Reply):
    position = fields.Integer(required=True)
    ahead = fields.Integer(required=True)


class RejectSchema(Reply):
    Code = fields.Integer(required=True)
    As = fields.String(required=True)
    Reason = fields.String(required=True)


class VerdictSchema(Reply):
    state = fields.String(required=True)
    checks = fields.List(fields.Raw(), required=True)
    fleet = fields.Raw()


class RunSummarySchema(Reply):
    run_id = fields.String(required=True)
    state = fields.String(required=True)
    created_at = _ts(required=True)
    work_id = fields.String()
    principal = fields.String()
    principal_self_declared = fields.Boolean(
        metadata={"description": _SELF_DECLARED.format(what="the principal")}
    )
    token = fields.String(metadata={"description": _TOKEN})
    team = fields.String(
        required=True,
        metadata={"description": "the run's team, as stored at submit (configured or not)"},
    )
    ended_at = _ts()
    expected_start = _ts(
        allow_none=True,
        metadata={"description": "while QUEUED: when it is expected to start, or null"},
    )
    expected_basis = fields.String(
        validate=validate.OneOf(BASES),
        metadata={"description": "while QUEUED: what expected_start rests on"},
    )


class ShareSchema(Reply):
    """A QUEUED run's team as the queue orders it (docs/teams.md, "What a queued run shows")."""

    team = fields.String(required=True)
    weight = fields.Float(required=True, allow_none=True)
    share = fields.Float(required=True, allow_none=True)
    usage = fields.Float(required=True, allow_none=True)
    factor = fields.Float(required=True, allow_none=True)
    running_nodes = fields.Integer(required=True)
    max_nodes = fields.Integer(required=True, allow_none=True)
    at_quota = fields.Boolean(required=True)
    reason = fields.String(metadata={"description": "while at_quota"})


class RunViewSchema(RunSummarySchema):
    assigned = fields.List(fields.Nested(AssignedSchema))
    reject = fields.Nested(RejectSchema)
    verdict = fields.Nested(VerdictSchema)
    steps = fields.List(fields.Nested(StepViewSchema), required=True)
    warnings = fields.List(fields.String())
    requires = fields.List(fields.Nested(RoleViewSchema), required=True)
    candidates_at = _ts(metadata={"description": "while QUEUED"})
    queue = fields.Nested(QueuePlaceSchema, metadata={"description": "while QUEUED"})
    priority = fields.Integer(metadata={"description": "queue.priority (while QUEUED)"})
    reserving = fields.Boolean(metadata={"description": "holds or may hold a reservation"})
    reserved = fields.List(fields.String(), metadata={"description": "nodes it has reserved"})
    share = fields.Nested(
        ShareSchema, metadata={"description": "while QUEUED, with teams configured"}
    )


class DryRunSchema(Reply):
    run_id = fields.String(required=True)
    state = fields.String(required=True, validate=validate.OneOf(["DRY_RUN"]))
    team = fields.String(required=True, metadata={"description": "the team the run would have"})
    assigned = fields.List(fields.Nested(AssignedSchema), required=True)
    warnings = fields.List(fields.String(), required=True)


class TeamLineSchema(Reply):
    name = fields.String(required=True)
    weight = fields.Float(required=True)
    share = fields.Float(
        required=True,
        allow_none=True,
        metadata={
            "description": "its weight over the weights of the teams with runs queued or "
            "running; null while it has none"
        },
    )
    usage = fields.Float(
        required=True, allow_none=True, metadata={"description": "null: not kept yet"}
    )
    factor = fields.Float(
        required=True, allow_none=True, metadata={"description": "null: not kept yet"}
    )
    running_nodes = fields.Integer(
        required=True, metadata={"description": "leases held by its runs"}
    )
    queued = fields.Integer(required=True, metadata={"description": "its QUEUED runs"})
    max_nodes = fields.Integer(
        required=True, allow_none=True, metadata={"description": "null: unset"}
    )
    max_queued = fields.Integer(
        required=True, allow_none=True, metadata={"description": "null: unset"}
    )


class TeamsSchema(Reply):
    observed_at = _ts(required=True)
    teams = fields.List(fields.Nested(TeamLineSchema), required=True)


class TeamUsageHourSchema(Reply):
    hour = _ts(required=True, metadata={"description": "the hour's start"})
    node_seconds = fields.Dict(
        keys=fields.String(),
        values=fields.Float(),
        required=True,
        metadata={"description": "team -> node-seconds charged to it in that hour"},
    )


class TeamUsageSchema(Reply):
    observed_at = _ts(required=True)
    hours = fields.List(
        fields.Nested(TeamUsageHourSchema),
        required=True,
        metadata={
            "description": "the last 24 hours, oldest first; an hour with nothing charged is absent"
        },
    )


class RunListSchema(Reply):
    observed_at = _ts(required=True)
    runs = fields.List(fields.Nested(RunSummarySchema), required=True)
    next = fields.String(metadata={"description": "the before= of the next page, when full"})


class Reason(str):
    """A field's error that is the whole reason of the 400 as it stands (it names its field
    itself, or is a reason the wire fixed, such as ``invalid attempt``)."""


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable(text: str) -> bool:
    """Text PostgreSQL refuses to store or compare: a NUL, or a lone surrogate
    (docs/security.md#input-and-load)."""
    return _UNSTORABLE.search(text) is not None


class QuerySchema(Schema):
    """A query string: unknown parameters are ignored, and an absent one is None in what the
    view gets (not a documented default: a query has no null)."""

    class Meta:
        unknown = EXCLUDE

    @post_load
    def absent_is_none(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return {name: None for name in self.load_fields} | data


def _converted(convert: Callable[[Any], Any], value: Any, reason: str) -> Any:
    """``convert(value)``, or a field error whose whole reason is ``reason`` (a ValueError)."""
    try:
        return convert(value)
    except ValueError:
        raise ValidationError(Reason(reason)) from None


class QueryText(fields.String):
    """A query parameter the database can compare: no NUL, no lone surrogate
    (docs/security.md#input-and-load); empty is absent."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        text = super()._deserialize(value, attr, data, **kwargs)
        if unstorable(text):
            raise ValidationError(
                Reason(f"{self.name} must not contain a NUL character, got {text!r}")
            )
        return text or None


class QueryTime(QueryText):
    """An RFC 3339 time; empty is absent."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        text = super()._deserialize(value, attr, data, **kwargs)
        if text is None:
            return None
        return _converted(parse_ts, text, f"{self.name} must be an RFC 3339 time, got {text!r}")


class TeamQuery(QueryText):
    """A team's name (docs/teams.md); empty is absent."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        text = super()._deserialize(value, attr, data, **kwargs)
        if text is not None and TEAM_NAME_PATTERN.match(text) is None:
            raise ValidationError(
                Reason(f"{self.name} must be a team name, {TEAM_NAME_RULE}, got {text!r}")
            )
        return text


class RunCursor(QueryText):
    """The run list's paging cursor ``<created_at>,<run_id>`` as (time, run_id); empty is absent."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        text = super()._deserialize(value, attr, data, **kwargs)
        if text is None:
            return None
        stamp, _, run_id = text.partition(",")
        try:
            cursor = (parse_ts(stamp), run_id)
        except ValueError:
            cursor = None
        if cursor is None or not run_id:
            raise ValidationError(
                Reason(f"{self.name} must be the cursor <created_at>,<run_id>, got {text!r}")
            )
        return cursor


class QueryLimit(fields.Integer):
    """A positive count in ASCII digits (``int()`` would also take ``1_000`` and other scripts'
    digits), capped at ``cap``."""

    def __init__(self, *, cap: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cap = cap

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        text = str(value)
        if not re.fullmatch(r"[+-]?[0-9]{1,12}", text.strip()) or int(text) <= 0:
            raise ValidationError(Reason(f"{self.name} must be a positive integer, got {text!r}"))
        return min(int(text), self.cap)


LOG_NAME_SCHEMA = {
    "type": "string",
    "maxLength": 200,
    # Empty (the step's own), or a name that is neither "." nor "..".
    "pattern": (
        f"^(|{NAME_CHARACTERS_BUT_DOT}{NAME_CHARACTERS}*"
        f"|\\.{NAME_CHARACTERS_BUT_DOT}{NAME_CHARACTERS}*|\\.\\.{NAME_CHARACTERS}+)$"
    ),
    "default": "step",
}


class LogName(fields.String):
    """``?name=`` of a log: one plain file-name segment, so it cannot leave the Record
    (docs/security.md#runs-records-and-uploads); empty is the step's own log, ``step``."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        name = super()._deserialize(value, attr, data, **kwargs) or "step"
        if not is_valid_id(name) or name in {".", ".."}:
            raise ValidationError(Reason(f"{self.name} must be {NAME_RULE}, got {name!r}"))
        return name


class ByteOffset(fields.Integer):
    """A byte offset into a file: ASCII digits, at most 18 of them."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        text = str(value)
        if not (text.isascii() and text.isdigit()) or len(text) > 18:
            raise ValidationError(Reason(f"{self.data_key} must be a byte offset, got {text!r}"))
        return int(text)


class Seconds(fields.Float):
    """A number of seconds as ``float()`` reads it."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        return _converted(float, value, f"{self.name} must be a number of seconds, got {value!r}")


class ClaimQuerySchema(QuerySchema):
    """``POST /v1/nodes/{node_id}/claim``: how long to wait for a step."""

    wait = Seconds(
        metadata={
            "description": "seconds to wait for a step, at most claim.long_poll_seconds "
            "(a negative one is 0)"
        },
    )


class _LogQuerySchema(QuerySchema):
    """Which log of a step: the ``name`` both log routes take."""

    name = LogName(
        load_default="step",
        metadata={**LOG_NAME_SCHEMA, "description": "which log of the step: one file-name segment"},
    )


class LogReadQuerySchema(_LogQuerySchema):
    """``GET /v1/runs/{run_id}/steps/{seq}/log``: which log, from which byte."""

    offset = ByteOffset(
        data_key="from",
        load_default=0,
        metadata={
            "description": "a byte offset into the log",
            "minimum": 0,
            "maximum": 999_999_999_999_999_999,
            "default": 0,
        },
    )


class LogWriteQuerySchema(_LogQuerySchema):
    """``PUT /v1/runs/{run_id}/steps/{seq}/log``: which log, and whether the body is a progress
    chunk of an attempt (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log)."""

    progress = fields.String(
        metadata={"description": "1: the body is a progress chunk (any other value: the log)"},
    )
    attempt = fields.String(
        metadata={
            "description": "with progress=1: the 0-based attempt the chunk belongs to, "
            "at most 9 digits, else 400 invalid attempt"
        },
    )

    @post_load
    def progress_attempt(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """``attempt``: the attempt a progress chunk belongs to, or None for the step's final
        log (any ``progress`` but 1)."""
        text = data.pop("attempt", None) or ""
        attempt = None
        if data.pop("progress", None) == "1":
            if not (text.isascii() and text.isdigit()) or len(text) > 9:
                raise ValidationError(Reason("invalid attempt"))
            attempt = int(text)
        data["attempt"] = attempt
        return data


RUN_LIST_MAX_LIMIT = 1000


class RunListQuerySchema(QuerySchema):
    """``GET /v1/runs`` and the runs page; unknown parameters are ignored
    (docs/api.md#get-v1runs--list-runs)."""

    # A state no run can have (runctl offers CANCELLED) lists no runs
    # (docs/api.md#get-v1runs--list-runs).
    state = QueryText(
        metadata={
            "pattern": r"^[^\x00]*$",
            "description": "exact state; one no run has lists none",
        },
    )
    since = QueryTime(
        metadata={
            "anyOf": [{"format": "date-time"}, {"maxLength": 0}],
            "description": "RFC 3339, inclusive on created_at; empty is no filter",
        },
    )
    work = QueryText(
        metadata={"pattern": r"^[^\x00]*$", "description": "a work_id"},
    )
    team = TeamQuery(
        metadata={
            "pattern": r"^([A-Za-z0-9][A-Za-z0-9._-]{0,62})?$",
            "description": "the runs of this team as stored (a team no longer configured "
            f"too); a team name is {TEAM_NAME_RULE}, else 400; empty is no filter",
        },
    )
    limit = QueryLimit(
        cap=RUN_LIST_MAX_LIMIT,
        load_default=100,
        validate=validate.Range(min=1, max=999_999_999_999),
        metadata={"description": "default 100; above 1000 is 1000", "default": 100},
    )
    before = RunCursor(
        metadata={
            "anyOf": [{"format": "run-cursor"}, {"maxLength": 0}],
            "description": "paging cursor <created_at>,<run_id> (an RFC 3339 time, a comma and "
            "a run_id): the next of the previous page; empty is the first page",
        },
    )


class RunStateSchema(Reply):
    run_id = fields.String(required=True)
    state = fields.String(required=True)


class NodeLeaseSchema(Reply):
    run_id = fields.String(required=True)
    not_after = _ts(required=True)


class AdvertisedCapabilitySchema(Reply):
    capability = fields.String(required=True)
    attrs = fields.Dict(keys=fields.String(), values=fields.String(), required=True)


_REASON = "why, for the people who will read it: 1 byte to 1 KiB of UTF-8"


class NodeHoldSchema(Reply):
    mode = fields.String(required=True, validate=validate.OneOf(["graceful", "at-boundary"]))
    reason = fields.String(required=True)
    by = fields.String(required=True)
    at = _ts(required=True)


class NodeHealthSchema(Reply):
    state = fields.String(required=True, validate=validate.OneOf(["ok", "quarantined"]))
    strikes = fields.Integer(required=True)
    since = _ts(metadata={"description": "while quarantined"})
    reason = fields.String(metadata={"description": "while quarantined"})


class NodeViewSchema(Reply):
    node_id = fields.String(required=True)
    label = fields.String(required=True, allow_none=True)
    instance = fields.String(required=True, allow_none=True)
    capabilities = fields.List(fields.Nested(AdvertisedCapabilitySchema), required=True)
    seen_at = _ts(required=True)
    expires_at = _ts(required=True)
    live = fields.Boolean(required=True)
    lease = fields.Nested(NodeLeaseSchema, required=True, allow_none=True)
    draining = fields.Boolean(
        required=True,
        metadata={"description": "the advert's drain or an operator's hold (docs/operators.md)"},
    )
    drain_mode = fields.String(
        required=True,
        allow_none=True,
        validate=validate.OneOf(["graceful", "at-boundary"]),
        metadata={
            "description": "the drain in force: the stronger of the advert's and the hold's"
            " mode, null when neither"
        },
    )
    hold = fields.Nested(
        NodeHoldSchema,
        required=True,
        allow_none=True,
        metadata={"description": "an operator's drain, apart from the advert's"},
    )
    health = fields.Nested(NodeHealthSchema, required=True)


class NodeDrainBodySchema(Schema):
    """``POST /v1/nodes/{id}/drain``: an operator's hold (docs/operators.md)."""

    mode = fields.String(required=True, validate=validate.OneOf(["graceful", "at-boundary"]))
    reason = fields.String(
        required=True, validate=validate.Length(min=1, max=1024), metadata={"description": _REASON}
    )


class NodeQuarantineBodySchema(Schema):
    """``POST /v1/nodes/{id}/quarantine`` (docs/operators.md)."""

    reason = fields.String(
        required=True, validate=validate.Length(min=1, max=1024), metadata={"description": _REASON}
    )


class NodeListSchema(Reply):
    observed_at = _ts(required=True)
    nodes = fields.List(fields.Nested(NodeViewSchema), required=True)


class CapabilityViewSchema(Reply):
    capability = fields.String(required=True)
    nodes = fields.Integer(required=True)
    attrs = fields.Dict(keys=fields.String(), values=fields.List(fields.String()), required=True)


class CapabilitiesSchema(Reply):
    capabilities = fields.List(fields.Nested(CapabilityViewSchema), required=True)


class EventSchema(Reply):
    at = _ts(required=True)
    from_ = fields.String(data_key="from", required=True, allow_none=True)
    to = fields.String(required=True)
    cause = fields.String(required=True, allow_none=True)
    by = fields.String(required=True, allow_none=True)
    by_self_declared = fields.Boolean(metadata={"description": _SELF_DECLARED.format(what="by")})
    token = fields.String(metadata={"description": _TOKEN})


class EventsSchema(Reply):
    events = fields.List(fields.Nested(EventSchema), required=True)


class ErrorDetailSchema(Schema):
    class Meta:
        unknown = RAISE

    code = fields.Integer(required=True, metadata={"description": "the HTTP status"})
    reason = fields.String(required=True, metadata={"description": "names the field at fault"})


class ErrorBodySchema(Schema):
    """Every error the Mediator answers: ``{"error": {"code", "reason"}}``."""

    class Meta:
        unknown = RAISE

    error = fields.Nested(ErrorDetailSchema, required=True)


class JSONInteger(fields.Integer):
    """An integer as JSON has it: ``3184.0`` is the number 3184 (JSON Schema says so too), while
    ``1.5``, ``true`` and ``"3"`` are not integers."""

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> Any:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return super()._deserialize(value, attr, data, **kwargs)


class ResultSchema(AgentBody):
    """``POST …/steps/{seq}/result`` from a node agent. Only the fields the Mediator decides on
    (``node``, ``exit_code``, ``produced``) are refused for their type; ``error`` of any length
    within the body limit is taken (stored cut at 64 KiB), and the newer fields are kept when
    well-formed, else dropped with a log line
    (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl)."""

    class Meta:
        unknown = EXCLUDE

    node = fields.String(required=True, validate=NAME)
    # Any exit code an operating system reports (Windows: 0xC0000005 is 3221225477); the column
    # is a bigint, so beyond 64 bits is a 400 (docs/contract.md#limits).
    exit_code = JSONInteger(
        allow_none=True,
        strict=True,
        validate=validate.Range(min=INT64_MIN, max=INT64_MAX, error=INT64_ERROR),
    )
    produced = fields.List(
        fields.String(validate=validate.Length(max=200)),
        load_default=list,
        validate=validate.Length(max=500),
    )
    error = fields.String(allow_none=True)
    harness = fields.Raw(allow_none=True)
    workspace = fields.Raw(allow_none=True)
    changed = fields.Raw(allow_none=True)
    exited_at = fields.Raw(allow_none=True)
    diagnostics = fields.Raw(allow_none=True)
    environment = fields.Raw(allow_none=True)
    nonce = fields.String(allow_none=True, validate=validate.Length(max=200))


class ResultReplySchema(Reply):
    run_id = fields.String(required=True)
    seq = fields.Integer(required=True)
    run_state = fields.String(
        metadata={"description": "the run's state once it ended with this step, else empty"}
    )
    rolled_back = fields.Boolean(metadata={"description": "true: the step was reset to retry"})


class ClaimSchema(Reply):
    """The step as the node agent runs it: its kind's body under the kind's own key."""

    step_id = fields.String(required=True, metadata={"example": "kernel-4711-boot#01"})
    run_id = fields.String(required=True)
    seq = fields.Integer(required=True)
    name = fields.String(required=True, metadata={"description": "the step's id"})
    uses = fields.String(required=True, allow_none=True)
    kind = fields.String(required=True, validate=validate.OneOf(["run", "agent"]))
    run = fields.List(fields.String())
    agent = fields.Dict()
    env = fields.List(fields.String(), required=True)
    collect = fields.Dict(keys=fields.String(), values=fields.String(), required=True)
    workspace = fields.Dict()
    in_ = fields.Dict(data_key="in", required=True)
    out = fields.List(fields.String(), required=True)
    schema = fields.Dict(required=True)
    attempt = fields.Integer(metadata={"description": "0-based; omitted when 0"})
    requester = fields.String(required=True, allow_none=True)
    envelope_key = fields.String(allow_none=True)
    feedback = fields.List(fields.String())
    check_changed = fields.List(fields.String())
    ledger = fields.List(fields.Dict())
    lease = fields.Nested(LeaseSchema, required=True)


class ShownSchema(Reply):
    name = fields.String(required=True)
    content = fields.Raw(metadata={"description": "a JSON artifact as itself, else text"})
    truncated = fields.Boolean()
    missing = fields.Boolean()


class AskViewSchema(Reply):
    run_id = fields.String(required=True)
    seq = fields.Integer(required=True)
    step = fields.String(required=True)
    prompt = fields.String(required=True, allow_none=True)
    schema = fields.Dict(required=True, allow_none=True)
    asked_at = _ts(required=True, allow_none=True)
    can_answer = fields.Boolean(required=True)
    answerers = fields.List(fields.String())
    deadline = _ts()
    shown = fields.List(fields.Nested(ShownSchema))


class AsksSchema(Reply):
    asks = fields.List(fields.Nested(AskViewSchema), required=True)


class LedgerEntrySchema(Reply):
    seq = fields.Integer(required=True)
    attempt = fields.Integer(required=True)
    name = fields.String(required=True)
    by = fields.String(required=True, allow_none=True)
    at = _ts(required=True)
    bytes = fields.Integer(required=True)
    schema_ok = fields.Boolean()
    run_id = fields.String(metadata={"description": "an earlier run of the same work"})
    by_self_declared = fields.Boolean(metadata={"description": _SELF_DECLARED.format(what="by")})
    token = fields.String(metadata={"description": _TOKEN})


class LedgerSchema(Reply):
    entries = fields.List(fields.Nested(LedgerEntrySchema), required=True)
