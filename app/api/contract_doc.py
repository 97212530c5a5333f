"""The run contract (docs/contract.md#writing-contracts, docs/contract.md#warnings) as marshmallow
schemas, for the OpenAPI document only.

A contract is validated by ``app.contract`` in a fixed order, so that the first failure names its
field and value; these schemas say the same rules in JSON Schema, as far as JSON Schema can: what
it cannot say — references between steps and roles (``uses``, ``needs``, ``release``, branch and
loop targets, ``schema`` and ``collect`` keys among ``out``, what is read is produced), byte
lengths of attributes, a duration of zero — is the validator's alone, and answers 400 as well.
Unknown fields at the top level, in a step and in a condition are ignored with a warning, so
those objects allow extra properties; every other object refuses them, as the validator does.
A test checks that every contract the validator takes is valid against the generated schema.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from marshmallow import INCLUDE, RAISE, Schema, fields, validate

from app.contract.fields import FORMAT_CHARACTERS
from app.names import CAPABILITY_PATTERN, MAX_NAME, NAME_CHARACTERS

MAX_INT = 2**31 - 1  # integers of a contract fit a PostgreSQL integer
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


# ECMAScript patterns (the OpenAPI document's), where ``$`` is the end of the string.
def _name() -> list[validate.Validator]:
    return [validate.Length(min=1, max=MAX_NAME), validate.Regexp(f"^{NAME_CHARACTERS}+$")]


def _capability() -> list[validate.Validator]:
    return [
        validate.Length(min=1, max=MAX_NAME),
        validate.Regexp(f"^{CAPABILITY_PATTERN}$"),
    ]


def _artifact() -> list[validate.Validator]:
    # 1-200 characters, not starting with "_" (the Mediator's own), no separator, NUL or other
    # control character, no Unicode format character: it becomes a file name in the Record.
    refused = r"/\\\x00-\x1f\x7f-\x9f" + FORMAT_CHARACTERS
    return [validate.Length(min=1, max=200), validate.Regexp(f"^[^_{refused}][^{refused}]*$")]


_TERM = r"([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h|d)"
DURATION = {
    "type": "string",
    "maxLength": 64,
    "pattern": rf"^\+?({_TERM})+$",
    "description": 'a positive duration: Go\'s form ("30m", "1h30m", "1.5h", "250ms") or days ("2d")',
    "example": "4h",
}


def _int(minimum: int = -MAX_INT - 1, maximum: int = MAX_INT, **kw: Any) -> fields.Integer:
    return fields.Integer(strict=True, validate=validate.Range(min=minimum, max=maximum), **kw)


def _exit_code(**kw: Any) -> fields.Integer:
    return fields.Integer(strict=True, validate=validate.Range(min=INT64_MIN, max=INT64_MAX), **kw)


def _names(**kw: Any) -> fields.List:
    return fields.List(fields.String(validate=_name()), **kw)


def _artifacts(**kw: Any) -> fields.List:
    return fields.List(fields.String(validate=_artifact()), **kw)


def _duration(description: str | None = None, **kw: Any) -> fields.Raw:
    meta = {**DURATION, "description": description} if description else DURATION
    return fields.Raw(metadata=meta, **kw)


class OneOf(fields.Raw):
    """A value that is one of several shapes, documented as ``oneOf`` (schemas, or literal JSON
    Schema objects). Documentation only."""

    def __init__(
        self, *choices: type[Schema] | Callable[[], type[Schema]] | dict[str, Any], **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.choices = choices


class Closed(Schema):
    """An object that refuses fields it does not know (the validator's 400 ``unknown field``)."""

    class Meta:
        unknown = RAISE


class Open(Schema):
    """An object whose unknown fields are ignored with a line in ``warnings``
    (docs/contract.md#warnings)."""

    class Meta:
        unknown = INCLUDE


# ------------------------------------------------------------------------------ requirements


class RequirementSchema(Closed):
    """A role: ``as``, ``capability``, ``count`` and string attributes, flat."""

    class Meta:
        unknown = RAISE
        openapi = {
            "additionalProperties": {
                "type": "string",
                "maxLength": 1024,
                "description": "an attribute the node's capability entry must have, equal",
            },
            "propertyNames": {"minLength": 1, "maxLength": 200},
            "example": {"as": "dut", "capability": "board", "soc": "imx8mp"},
        }

    as_ = fields.String(data_key="as", required=True, validate=_name())
    capability = fields.String(required=True, validate=_capability())
    count = _int(0, metadata={"description": "nodes for this role; 0 means 1", "default": 1})


class AcquireWantSchema(RequirementSchema):
    """What an acquire step grabs: one more node, under a role ``requires`` does not declare."""

    class Meta(RequirementSchema.Meta):
        openapi = {
            **RequirementSchema.Meta.openapi,
            "example": {"as": "probe", "capability": "scope"},
        }

    count = _int(0, 1, metadata={"description": "exactly one node (0 means 1)"})


class FleetRequirementSchema(RequirementSchema):
    """A ``fleet_has`` requirement: like a role, ``as`` optional."""

    class Meta(RequirementSchema.Meta):
        openapi = {**RequirementSchema.Meta.openapi, "example": {"capability": "board"}}

    as_ = fields.String(data_key="as", validate=_name())


# ---------------------------------------------------------------------------- artifact schemas


# A nested schema has the same form and is checked the same way (400 naming its path), but the
# document does not say so by a reference to itself: a recursive schema is one that request
# generators such as schemathesis cannot negate reliably, and an object is all a client needs.
NESTED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "a nested schema of the same form, in the same keywords",
}


class ArtifactSchemaSchema(Closed):
    """The JSON schema an artifact must satisfy, in the allowed keywords only (nothing that
    fetches or runs): ``type, required, properties, enum, items, additionalProperties, title,
    description``."""

    type = fields.Raw(
        metadata={
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
        }
    )
    required = fields.List(fields.String())
    properties = fields.Dict(keys=fields.String(), values=fields.Raw(metadata=NESTED_SCHEMA))
    enum = fields.List(fields.Raw())
    items = OneOf(NESTED_SCHEMA, {"type": "boolean"})
    additionalProperties = OneOf(NESTED_SCHEMA, {"type": "boolean"})
    title = fields.String()
    description = fields.String()


# ----------------------------------------------------------------------------- step kinds


class AgentSchema(Closed):
    model = fields.String()
    max_turns = _int(1)
    max_tokens = _int(1)
    ask = fields.Raw(metadata={"description": "the harness's own"})
    harness = fields.String()
    mcp = fields.List(fields.String())
    pack = fields.Raw(metadata={"description": "the harness's own"})


class AskTimeoutSchema(Closed):
    after = _duration(required=True)
    then = fields.String(validate=validate.OneOf(["fail"]))


class AskSchema(Closed):
    prompt = fields.String(required=True, validate=validate.Length(min=1))
    answerers = fields.List(
        fields.String(validate=validate.Length(min=1, max=200)),
        metadata={"description": "principals who may answer; anyone when absent"},
    )
    timeout = fields.Nested(AskTimeoutSchema)
    show = _artifacts(metadata={"description": "artifacts shown to the answerers"})


class AcquireSchema(Closed):
    want = fields.Nested(AcquireWantSchema, required=True)
    acquired = fields.String(
        required=True, validate=_name(), metadata={"description": "a later step, run if granted"}
    )
    unavailable = fields.String(
        required=True, validate=_name(), metadata={"description": "a later step, run if not"}
    )


# -------------------------------------------------------------------------- step fields


class StepInSchema(Closed):
    prompt = fields.String()
    from_ = _artifacts(data_key="from", metadata={"description": "artifacts some step produces"})


class SeeSchema(Closed):
    ledger = fields.String(validate=validate.OneOf(["", "none", "list"]))
    from_ = fields.List(fields.Raw(), data_key="from", validate=validate.Length(max=0))


class WorkspaceSchema(Closed):
    repo = fields.String(required=True, validate=validate.Length(min=1))
    rev = fields.String(validate=validate.Length(min=1))


class DispatchSchema(Closed):
    from_ = fields.String(
        data_key="from",
        required=True,
        validate=validate.Regexp(r"^.+\..+$"),
        metadata={"description": "<out>.<field>[.<field>]: a field of one of the step's outs"},
    )
    to = _names(
        required=True,
        validate=validate.Length(min=2),
        metadata={"description": "later step ids, each once; one is chosen"},
    )


class LoopUntilSchema(Closed):
    class Meta:
        unknown = RAISE
        openapi = {"minProperties": 1}

    exit_code = _exit_code()
    produced = _artifacts()


class LoopSchema(Closed):
    back_to = fields.String(required=True, validate=_name())
    max = _int(2, required=True)
    until = fields.Nested(LoopUntilSchema, required=True)


_KINDS = ("run", "agent", "ask", "acquire")
# Fields a kind cannot act on (ask and acquire steps run on no node).
_ASK_TAKES_NO = ("uses", "feedback", "see", "env", "workspace", "collect")
_ACQUIRE_TAKES_NO = (
    *_ASK_TAKES_NO,
    "in",
    "out",
    "schema",
    "dispatch",
    "loop",
    "validate_with",
    "max_attempts",
)


def _kind(kind: str, *also: str, takes_no: tuple[str, ...] = ()) -> dict[str, Any]:
    refused = [k for k in _KINDS if k != kind] + list(takes_no)
    branch: dict[str, Any] = {
        "required": [kind, *also],
        "not": {"anyOf": [{"required": [k]} for k in refused]},
    }
    if kind == "ask":  # exactly one out: the answer
        branch["properties"] = {"out": {"minItems": 1, "maxItems": 1}}
    return branch


class StepSchema(Open):
    """One step: exactly one kind (``run``, ``agent``, ``ask``, ``acquire``) and the common
    fields. ``uses`` is required for run and agent steps and must be absent for ask and
    acquire steps; an ask step has exactly one ``out``."""

    class Meta:
        unknown = INCLUDE
        openapi = {
            "oneOf": [
                _kind("run", "uses"),
                _kind("agent", "uses"),
                _kind("ask", "out", takes_no=_ASK_TAKES_NO),
                _kind("acquire", takes_no=_ACQUIRE_TAKES_NO),
            ],
            "example": {"id": "boot", "uses": "dut", "run": ["boot-test"], "out": ["result.json"]},
        }

    id = fields.String(required=True, validate=_name())
    run = fields.List(
        fields.String(), validate=validate.Length(min=1), metadata={"description": "argv, no shell"}
    )
    agent = fields.Nested(AgentSchema)
    ask = fields.Nested(AskSchema)
    acquire = fields.Nested(AcquireSchema)
    uses = fields.String(validate=_name(), metadata={"description": "a role"})
    needs = _names(metadata={"description": "earlier step ids; [] starts at once"})
    in_ = fields.Nested(StepInSchema, data_key="in")
    feedback = fields.List(fields.String())
    see = fields.Nested(SeeSchema)
    out = _artifacts(metadata={"description": "artifact names, each once"})
    schema = fields.Dict(
        keys=fields.String(),
        values=fields.Nested(ArtifactSchemaSchema),
        metadata={"description": "artifact (in out) -> the JSON schema it must satisfy"},
    )
    env = fields.List(
        fields.String(validate=validate.Regexp(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")),
        metadata={"description": "names of variables passed through"},
    )
    workspace = fields.Nested(WorkspaceSchema)
    collect = fields.Dict(
        keys=fields.String(),
        values=fields.String(validate=validate.Regexp(r"^[^/\\\x00][^\x00]*$")),
        metadata={"description": 'artifact (in out) -> a relative path, no ".." component'},
    )
    release = _names(metadata={"description": "roles released after this step"})
    dispatch = fields.Nested(DispatchSchema)
    loop = fields.Nested(LoopSchema)
    validate_with = fields.String(validate=_name(), metadata={"description": "a later step id"})
    max_attempts = _int(1, metadata={"description": "with validate_with; default 1"})


# ------------------------------------------------------------------------------ conditions


class StepConditionSchema(Open):
    """A step's outcome: what it produced, its exit code (run steps only), what it changed."""

    class Meta:
        unknown = INCLUDE
        openapi = {"not": {"required": ["fleet_has"]}}

    step = fields.String(required=True, validate=_name())
    produced = _artifacts()
    exit_code = _exit_code()
    changed = fields.List(
        fields.String(validate=validate.Regexp(r"^[^/\\\x00][^\x00]*$")),
        metadata={"description": "workspace paths the step must have changed"},
    )
    within_attempts = fields.Boolean()


class FleetConditionSchema(Open):
    """The fleet has at least ``min_count`` nodes that satisfy ``fleet_has``."""

    class Meta:
        unknown = INCLUDE
        openapi = {"not": {"required": ["step"]}}

    fleet_has = fields.Nested(FleetRequirementSchema, required=True)
    min_count = _int(1)


# ------------------------------------------------------------------------------- top level


class WorkIdSchema(Closed):
    system = fields.String(validate=validate.Length(min=1, max=200))
    change_id = fields.String(validate=validate.Length(min=1, max=200))


class WorkSchema(Closed):
    """The work this run belongs to; its key is ``id.system:id.change_id``, else
    ``system:change_id``."""

    id = fields.Nested(WorkIdSchema)
    system = fields.String(validate=validate.Length(min=1, max=200))
    change_id = fields.String(validate=validate.Length(min=1, max=200))
    patchset = _int()
    parent_rev = fields.String(validate=validate.Length(max=200))
    patch_rev = fields.String(validate=validate.Length(max=200))


class LedgerScopeSchema(Closed):
    scope = fields.String(validate=validate.OneOf(["run", "work"]))


class QueueSchema(Closed):
    timeout = _duration("a QUEUED run not promoted within it fails")
    priority = fields.Integer(
        validate=validate.Range(-100, 100),
        metadata={
            "description": "higher first in the queue (default 0); above the token's "
            "max_priority the submit is 403"
        },
    )
    team = fields.String(
        validate=validate.Length(min=1, max=200),
        metadata={
            "description": "the run's team: one the token may name (its team and teams; "
            "operators any); an unconfigured name is 400, one the token may not name 403. "
            "Left out: the token's team, else the team whose members list the token or its "
            "vouched principal, else default"
        },
    )


class ContractSchema(Open):
    """The run contract. Validated by the Mediator in a fixed order; the first failure is a 400
    naming its field and value. Rules between steps and roles are the Mediator's alone."""

    class Meta:
        unknown = INCLUDE
        openapi = {
            "example": {
                "run_id": "kernel-4711-boot",
                "requires": [{"as": "dut", "capability": "board", "soc": "imx8mp"}],
                "steps": [
                    {"id": "boot", "uses": "dut", "run": ["boot-test"], "out": ["result.json"]}
                ],
                "success_when": [{"step": "boot", "exit_code": 0, "produced": ["result.json"]}],
            }
        }

    run_id = fields.String(
        required=True, validate=_name(), metadata={"description": "the idempotency key"}
    )
    work = fields.Nested(WorkSchema)
    requires = fields.List(
        fields.Nested(RequirementSchema), required=True, validate=validate.Length(min=1, max=50)
    )
    steps = fields.List(
        fields.Nested(StepSchema), required=True, validate=validate.Length(min=1, max=500)
    )
    success_when = fields.List(
        OneOf(StepConditionSchema, FleetConditionSchema), validate=validate.Length(max=500)
    )
    ledger = fields.Nested(LedgerScopeSchema)
    queue = fields.Nested(QueueSchema)
    lease = fields.Raw(metadata={"description": "ignored: lease times are the server's"})
