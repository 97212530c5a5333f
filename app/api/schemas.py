"""Marshmallow schemas of the request and response bodies; the OpenAPI document is generated from
them (route 21). Request schemas validate; response schemas document what the services return."""

from __future__ import annotations

import re
from typing import Any

from marshmallow import EXCLUDE, INCLUDE, Schema, fields, pre_load, validate

NAME = validate.And(validate.Length(min=1, max=200), validate.Regexp(r"^[A-Za-z0-9._:@-]+$"))
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT64_ERROR = "must be a signed 64-bit integer, got {input}"
CAPABILITY = validate.And(validate.Length(min=1, max=200), validate.Regexp(r"^[a-z][a-z0-9._-]*$"))


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def without_nul(value: Any) -> Any:
    """Every NUL in the strings of a JSON value (keys included) as U+FFFD (SPEC §19.3), and every
    lone surrogate (JSON's ``"\\ud800"``) too: PostgreSQL can store neither."""
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value)
    if isinstance(value, list):
        return [without_nul(v) for v in value]
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    return value


class AgentBody(Schema):
    """What a node agent sends is never refused for its text: a NUL becomes U+FFFD first."""

    @pre_load
    def _without_nul(self, data: Any, **_: Any) -> Any:
        return without_nul(data)


class CapabilitySchema(Schema):
    class Meta:
        unknown = EXCLUDE

    capability = fields.String(required=True, validate=CAPABILITY)
    # ``attrs: null`` is ``{}`` (SPEC §19.2).
    attrs = fields.Dict(
        keys=fields.String(validate=validate.Length(min=1, max=200)),
        values=fields.String(validate=validate.Length(max=1024)),
        load_default=dict,
        allow_none=True,
    )


class PolicySchema(Schema):
    class Meta:
        unknown = EXCLUDE

    # Any value is taken and an unknown one folded to "" by the service (SPEC §4).
    drain = fields.Raw(load_default="", allow_none=True)


class NodeAdvertSchema(AgentBody):
    """``POST /v1/nodes``; extra fields of older agents are ignored. ``capabilities: null`` is no
    capabilities: the advert is taken and leases renew, the node gets no new work (SPEC §19.2)."""

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


class LeaseSchema(Schema):
    run_id = fields.String()
    node = fields.String()
    capability = fields.String()
    not_after = fields.String(metadata={"format": "date-time"})
    nonce = fields.String()


class AdvertReplySchema(Schema):
    leases = fields.List(fields.Nested(LeaseSchema))
    renew_seconds = fields.Integer()
    drain = fields.String()


class ContractSchema(Schema):
    """The run contract (SPEC §3). Documented here; validated by ``app.contract`` in a fixed
    order so that the first failure names its field and value."""

    class Meta:
        unknown = INCLUDE

    run_id = fields.String(required=True, validate=NAME)
    work = fields.Dict()
    requires = fields.List(fields.Dict(), required=True)
    steps = fields.List(fields.Dict(), required=True)
    success_when = fields.List(fields.Dict())
    ledger = fields.Dict()
    queue = fields.Dict()


class AssignedNodeSchema(Schema):
    node = fields.String()
    label = fields.String(allow_none=True)


class AssignedSchema(Schema):
    as_ = fields.String(data_key="as")
    nodes = fields.List(fields.Nested(AssignedNodeSchema))


class StepViewSchema(Schema):
    seq = fields.Integer()
    id = fields.String()
    kind = fields.String()
    state = fields.String()
    uses = fields.String()
    node = fields.String()
    needs = fields.List(fields.String())
    attempt = fields.Integer()
    chosen = fields.Boolean()
    started_at = fields.String(metadata={"format": "date-time"})
    ended_at = fields.String(metadata={"format": "date-time"})


class RunViewSchema(Schema):
    run_id = fields.String()
    state = fields.String()
    work_id = fields.String()
    principal = fields.String()
    created_at = fields.String(metadata={"format": "date-time"})
    ended_at = fields.String(metadata={"format": "date-time"})
    assigned = fields.List(fields.Nested(AssignedSchema))
    reject = fields.Dict()
    verdict = fields.Dict()
    steps = fields.List(fields.Nested(StepViewSchema))
    warnings = fields.List(fields.String())
    requires = fields.List(fields.Dict())
    candidates_at = fields.String(metadata={"format": "date-time"})
    queue = fields.Dict()
    priority = fields.Integer()
    reserving = fields.Boolean()
    reserved = fields.List(fields.String())


class DryRunSchema(Schema):
    run_id = fields.String()
    state = fields.String()
    assigned = fields.List(fields.Nested(AssignedSchema))
    warnings = fields.List(fields.String())


class RunListSchema(Schema):
    observed_at = fields.String(metadata={"format": "date-time"})
    runs = fields.List(fields.Dict())
    next = fields.String()


class RunListQuerySchema(Schema):
    class Meta:
        unknown = EXCLUDE  # SPEC §14: unknown parameters ignored

    state = fields.String()
    since = fields.String()
    work = fields.String()
    limit = fields.String()
    before = fields.String()


class RunStateSchema(Schema):
    run_id = fields.String()
    state = fields.String()


class NodeListSchema(Schema):
    observed_at = fields.String(metadata={"format": "date-time"})
    nodes = fields.List(fields.Dict())


class CapabilitiesSchema(Schema):
    capabilities = fields.List(fields.Dict())


class EventsSchema(Schema):
    events = fields.List(fields.Dict())


class ErrorDetailSchema(Schema):
    code = fields.Integer()
    reason = fields.String()


class ErrorBodySchema(Schema):
    error = fields.Nested(ErrorDetailSchema)


class ResultSchema(AgentBody):
    """``POST …/steps/{seq}/result`` from a node agent. Only the fields the Mediator decides on
    (``node``, ``exit_code``, ``produced``) are refused for their type; ``error`` of any length
    within the body limit is taken (stored cut at 64 KiB), and the newer fields are kept when
    well-formed, else dropped with a log line (SPEC §19.3)."""

    class Meta:
        unknown = EXCLUDE

    node = fields.String(required=True, validate=NAME)
    # Any exit code an operating system reports (Windows: 0xC0000005 is 3221225477); the column
    # is a bigint, so beyond 64 bits is a 400 (SPEC §18).
    exit_code = fields.Integer(
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


class ResultReplySchema(Schema):
    run_id = fields.String()
    seq = fields.Integer()
    run_state = fields.String()
    rolled_back = fields.Boolean()


class ClaimSchema(Schema):
    step_id = fields.String()
    run_id = fields.String()
    seq = fields.Integer()
    name = fields.String()
    uses = fields.String()
    kind = fields.String()
    run = fields.List(fields.String())
    agent = fields.Dict()
    env = fields.List(fields.String())
    collect = fields.Dict()
    workspace = fields.Dict()
    in_ = fields.Dict(data_key="in")
    out = fields.List(fields.String())
    schema = fields.Dict()
    attempt = fields.Integer()
    requester = fields.String(allow_none=True)
    feedback = fields.List(fields.String())
    check_changed = fields.List(fields.String())
    ledger = fields.List(fields.Dict())
    lease = fields.Nested(LeaseSchema)


class AsksSchema(Schema):
    asks = fields.List(fields.Dict())


class LedgerSchema(Schema):
    entries = fields.List(fields.Dict())
