"""The one definition of what a name may be (docs/contract.md#limits): the characters of ids and
names (run, node, step and token ids, roles, artifact and log names) and of capability names,
for the contract's validator, the wire schemas, the OpenAPI document, the agent's configuration
and the tokens alike. Always matched whole (``fullmatch``): ``re.match`` with ``^…$`` also takes a
trailing newline, since ``$`` matches before one."""

from __future__ import annotations

import re

MAX_NAME = 200  # ids and names

NAME_CHARACTERS = "[A-Za-z0-9._:@-]"
NAME_RULE = f"1-{MAX_NAME} characters of {NAME_CHARACTERS}"
NAME_RE = re.compile(f"{NAME_CHARACTERS}{{1,{MAX_NAME}}}")
# The same rule as a JSON Schema (the OpenAPI document's path parameters and fields).
NAME_SCHEMA = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_NAME,
    "pattern": f"^{NAME_CHARACTERS}+$",
}

# A name that is one file-name segment (a log's or an artifact's) may not be "." or "..": these
# are the characters its first one may be when the name starts with a dot.
NAME_CHARACTERS_BUT_DOT = "[A-Za-z0-9_:@-]"

CAPABILITY_FIRST, CAPABILITY_REST = "[a-z]", "[a-z0-9._-]"
CAPABILITY_PATTERN = f"{CAPABILITY_FIRST}{CAPABILITY_REST}*"
CAPABILITY_RULE = f"{CAPABILITY_PATTERN} (at most {MAX_NAME} characters)"
CAPABILITY_RE = re.compile(f"{CAPABILITY_FIRST}{CAPABILITY_REST}{{0,{MAX_NAME - 1}}}")


def is_name(value: object) -> bool:
    """Whether ``value`` is an id or a name (:data:`NAME_RULE`)."""
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None


def is_capability(value: object) -> bool:
    """Whether ``value`` is a capability's name (:data:`CAPABILITY_RULE`)."""
    return isinstance(value, str) and CAPABILITY_RE.fullmatch(value) is not None
