"""Contract validation and needs normalisation (docs/contract.md#validation-errors). Pure: no
session, no I/O."""

from app.contract.fields import (
    check_json_depth,
    check_no_nul,
    is_valid_id,
    parse_duration,
    parse_json,
    parse_requirement,
    requires_key,
)
from app.contract.types import Contract, Role, StepDef
from app.contract.validate import validate_contract

__all__ = [
    "Contract",
    "Role",
    "StepDef",
    "check_json_depth",
    "check_no_nul",
    "is_valid_id",
    "parse_duration",
    "parse_json",
    "parse_requirement",
    "requires_key",
    "validate_contract",
]
