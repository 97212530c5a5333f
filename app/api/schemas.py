"""Marshmallow schemas of the request and response bodies; the OpenAPI document is generated from
them (route 21). Request schemas validate; response schemas document what the services return."""

from __future__ import annotations

from marshmallow import EXCLUDE, INCLUDE, Schema, fields, validate

NAME = validate.And(validate.Length(min=1, max=200), validate.Regexp(r"^[A-Za-z0-9._:@-]+$"))
CAPABILITY = validate.And(validate.Length(min=1, max=200), validate.Regexp(r"^[a-z][a-z0-9._-]*$"))


class CapabilitySchema(Schema):
    class Meta:
        unknown = EXCLUDE

    capability = fields.String(required=True, validate=CAPABILITY)
    attrs = fields.Dict(
        keys=fields.String(validate=validate.Length(min=1, max=200)),
        values=fields.String(validate=validate.Length(max=1024)),
        load_default=dict,
    )


class PolicySchema(Schema):
    class Meta:
        unknown = EXCLUDE

    # Any value is taken and an unknown one folded to "" by the service (SPEC §4).
    drain = fields.Raw(load_default="", allow_none=True)


class NodeAdvertSchema(Schema):
    """``POST /v1/nodes``; extra fields of older agents are ignored."""

    class Meta:
        unknown = EXCLUDE

    node_id = fields.String(
        required=True, validate=NAME, error_messages={"required": "node_id is missing"}
    )
    label = fields.String(allow_none=True, validate=validate.Length(max=200))
    instance = fields.String(allow_none=True, validate=validate.Length(max=200))
    capabilities = fields.List(
        fields.Nested(CapabilitySchema), load_default=list, validate=validate.Length(max=100)
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


class ResultSchema(Schema):
    """``POST …/steps/{seq}/result`` from a node agent."""

    class Meta:
        unknown = EXCLUDE

    node = fields.String(required=True, validate=NAME)
    exit_code = fields.Integer(allow_none=True, strict=True)
    produced = fields.List(
        fields.String(validate=validate.Length(max=200)),
        load_default=list,
        validate=validate.Length(max=500),
    )
    error = fields.String(allow_none=True, validate=validate.Length(max=4096))
    harness = fields.Raw(allow_none=True)
    workspace = fields.Raw(allow_none=True)
    changed = fields.Raw(allow_none=True)
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
    workspace = fields.Dict(allow_none=True)
    in_ = fields.Dict(data_key="in")
    out = fields.List(fields.String())
    schema = fields.Dict()
    attempt = fields.Integer()
    requester = fields.String(allow_none=True)
    ledger = fields.List(fields.Dict())
    lease = fields.Nested(LeaseSchema)


class AsksSchema(Schema):
    asks = fields.List(fields.Dict())


class LedgerSchema(Schema):
    entries = fields.List(fields.Dict())
