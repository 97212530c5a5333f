"""Field primitives of contract validation (docs/contract.md#validation-errors,
docs/contract.md#limits): the checks every rule group is built from.

Each check either returns the value, narrowed to its type, or raises ``BadRequest`` with a reason
that names the field and quotes the offending value with :func:`quote`. Nothing here knows about
steps or the order of the rules; ``app.contract.validate`` fixes that order.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Collection, Iterable
from typing import Any, NoReturn, TypeVar

from app.contract.types import Role
from app.errors import BadRequest
from app.names import CAPABILITY_RULE, MAX_NAME, NAME_RE, NAME_RULE, is_capability, is_name

MAX_DEPTH = 32
MAX_ATTR_BYTES = 1024  # attribute values (docs/contract.md#limits)
MAX_INT = 2**31 - 1  # every integer must fit a PostgreSQL integer and a timedelta
MIN_INT = -(2**31)

DURATION_RULE = 'a duration like "30m" or "4h"'

_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1
# Unicode's format characters (category Cf, as of Unicode 15.1; a test checks them against the
# running Python's own table): bidi controls such as U+202E, zero-width characters, the BOM, tags.
# The characters themselves, not escapes, so that one string serves Python's ``re`` and the
# ECMAScript patterns of the OpenAPI document alike.
FORMAT_CHARACTERS = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f"
)
_FORMAT_RE = re.compile(f"[{FORMAT_CHARACTERS}]")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")  # only a lone one survives json.loads
_UNSTORABLE_RE = re.compile("[\x00\ud800-\udfff]")
# One term of a duration as Go's time.ParseDuration reads it ("1.5h", "250ms", ".5s"), plus the
# day that this server took before Go durations were. Longer units first: "ms" before "m".
_DURATION_TERM_RE = re.compile(r"([0-9]*)(?:\.([0-9]*))?(ns|us|\u00b5s|\u03bcs|ms|s|m|h|d)")
_NS_PER_UNIT = {
    "ns": 1,
    "us": 10**3,
    "\u00b5s": 10**3,  # MICRO SIGN
    "\u03bcs": 10**3,  # GREEK SMALL LETTER MU
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
    "d": 86400 * 10**9,
}
_NS_PER_SECOND = 10**9
_ROLE_FIELDS = ("as", "capability", "count")

# The value types check_field knows how to describe in a reason.
_Sized = TypeVar("_Sized", str, list[Any])


# --------------------------------------------------------------------------------- failing


def fail(reason: str) -> NoReturn:
    raise BadRequest(reason)


def quote(value: object) -> str:
    """JSON-quote an offending value for a reason, shortened so error bodies stay bounded."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def article(kind: str) -> str:
    """``"a run"``, ``"an agent"``: a kind with its indefinite article."""
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


# ------------------------------------------------------------------------- presence and shape


def require(obj: dict[str, Any], key: str, path: str) -> Any:
    """``obj[key]``, or ``BadRequest`` ``"<path> is required"``."""
    if key not in obj:
        fail(f"{path} is required")
    return obj[key]


def check_field(
    obj: dict[str, Any],
    key: str,
    path: str,
    expect: type[_Sized],
    *,
    non_empty: bool = True,
    at_most: int | None = None,
) -> _Sized:
    """``obj[key]`` when it is present, a ``str`` or ``list`` as ``expect`` says, non-empty unless
    ``non_empty`` is false, and at most ``at_most`` characters or entries long.

    The reasons, in the order the checks run: ``"<path> is required"``; for a list
    ``"<path> must be a [non-empty ]list, got <value>"`` then ``"<path> must have at most <n>
    entries, got <len>"``; for a string one reason, ``"<path> must be a string of 1-<n>
    characters, got <value>"`` (or ``a non-empty string`` / ``a string`` without ``at_most``).
    """
    value = require(obj, key, path)
    if expect is list:
        # A list's length has a reason of its own, which counts the entries instead of quoting.
        if not isinstance(value, expect) or (non_empty and not value):
            fail(f"{path} must be a {'non-empty ' if non_empty else ''}list, got {quote(value)}")
        if at_most is not None and len(value) > at_most:
            fail(f"{path} must have at most {at_most} entries, got {len(value)}")
        return value
    if (
        not isinstance(value, expect)
        or (non_empty and not value)
        or (at_most is not None and len(value) > at_most)
    ):
        if at_most is not None:
            what = f"a string of {'1-' if non_empty else 'at most '}{at_most} characters"
        else:
            what = "a non-empty string" if non_empty else "a string"
        fail(f"{path} must be {what}, got {quote(value)}")
    return value


def check_dict(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        fail(f"{path} must be an object, got {quote(value)}")
    return value


def check_keys(obj: dict[str, Any], allowed: Collection[str], where: str) -> None:
    for key in obj:
        if key not in allowed:
            fail(f"{where}unknown field {quote(key)}")


def ignored_fields(obj: dict[str, Any], allowed: Collection[str], path: str) -> list[str]:
    """One warning per key of ``obj`` outside ``allowed``, naming its path (``steps[1].retries:
    unknown field, ignored``, docs/contract.md#warnings): unknown keys are ignored at the top level,
    in steps and in conditions, where the original system's client may send fields this server does
    not know."""
    return [f"{field_path(path, key)}: unknown field, ignored" for key in obj if key not in allowed]


def field_path(path: str, key: object) -> str:
    """``path.key``, or ``path["odd key"]`` for a key that is not a plain name; ``path`` may be
    empty (a top-level field)."""
    if isinstance(key, str) and NAME_RE.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{quote(key)}]" if path else quote(key)


def check_int(value: object, path: str, minimum: int = MIN_INT) -> int:
    # A bool is never an integer here, although Python says it is (true would read as count 1).
    if not isinstance(value, int) or isinstance(value, bool):
        what = "an integer" if minimum == MIN_INT else f"an integer >= {minimum}"
        fail(f"{path} must be {what}, got {quote(value)}")
    if value < minimum:
        fail(f"{path} must be an integer >= {minimum}, got {quote(value)}")
    if value > MAX_INT:
        fail(f"{path} must be at most {MAX_INT}, got {quote(value)}")
    return value


INT64_MAX = 2**63 - 1


def check_exit_code(value: object, path: str) -> int:
    """An exit code a contract expects: any one an operating system reports (Windows' NTSTATUS
    codes pass 32 bits), that is any signed 64-bit integer, as a result may report it."""
    if not isinstance(value, int) or isinstance(value, bool):
        fail(f"{path} must be an integer, got {quote(value)}")
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        fail(f"{path} must be a signed 64-bit integer, got {quote(value)}")
    return value


def check_str_list(value: object, path: str, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        fail(f"{path} must be a list of {what}, got {quote(value)}")
    return value


# ------------------------------------------------------------------------------------- names


def is_valid_id(value: str) -> bool:
    """A run_id or node_id (docs/contract.md#top-level; :data:`app.names.NAME_RULE`). An id from a
    URL that is not one names nothing; a NUL byte would even be refused by PostgreSQL."""
    return is_name(value)


def check_name_list(value: object, path: str, what: str) -> list[str]:
    names = check_str_list(value, path, what)
    for i, name in enumerate(names):
        if not is_name(name):
            fail(f"{path}[{i}] must be {NAME_RULE}, got {quote(name)}")
    return names


def has_control_character(text: str) -> bool:
    """Whether ``text`` holds a C0 control character, DEL or a C1 control character. Names only:
    prompts and other texts may hold newlines (docs/security.md#runs-records-and-uploads)."""
    return _CONTROL_RE.search(text) is not None


def has_format_character(text: str) -> bool:
    """Whether ``text`` holds a Unicode format character (category Cf): in a name it would show
    one file and be another (``report\u202etxt.exe`` reads as ``reportexe.txt``;
    docs/security.md#runs-records-and-uploads)."""
    return _FORMAT_RE.search(text) is not None


def _is_safe_file_name(name: str) -> bool:
    return (
        1 <= len(name) <= MAX_NAME
        and not name.startswith("_")
        and not any(c in name for c in "/\\\x00")
        and name.strip(".") != ""
    )


def is_artifact_name(name: object) -> bool:
    # Artifact names become file names in the Record: they must not escape its directory
    # (docs/security.md#runs-records-and-uploads), and names starting with "_" are the Mediator's
    # own (docs/contract.md#in-out-and-schema). A control character would split the name's line in
    # the sealed Record's SHA256SUMS (a newline) or hide in a listing, and a format character would
    # disguise it (docs/security.md#runs-records-and-uploads).
    return (
        isinstance(name, str)
        and _is_safe_file_name(name)
        and not has_control_character(name)
        and not has_format_character(name)
    )


def check_artifact_names(value: object, path: str) -> list[str]:
    names = check_str_list(value, path, "artifact names")
    for i, name in enumerate(names):
        if not _is_safe_file_name(name):
            fail(
                f"{path}[{i}] must be an artifact name (1-200 characters, not starting with "
                f'"_", no "/", "\\" or NUL, not only dots), got {quote(name)}'
            )
        if has_control_character(name):
            fail(f"{path}[{i}] must not contain a control character, got {quote(name)}")
        if has_format_character(name):
            fail(f"{path}[{i}] must not contain a Unicode format character, got {quote(name)}")
    return names


def subpath(path: str, key: str) -> str:
    return f"{path}.{key}" if NAME_RE.fullmatch(key) else f"{path}[{quote(key)}]"


def is_relative_path(rel: object) -> bool:
    """A non-empty path inside a workspace: not absolute and no ``..`` component (``collect``,
    docs/contract.md#workspace-and-collect; ``changed``, docs/contract.md#success_when); a node
    would read or judge outside its workspace otherwise."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or rel[0] in "/\\":
        return False
    return ".." not in re.split(r"[/\\]", rel)


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


# --------------------------------------------------------------------------------- durations


def parse_duration(text: str) -> float:
    """Seconds in a duration as Go's ``time.ParseDuration`` reads it (docs/contract.md#top-level),
    and ``"2d"``.

    A duration is an optional sign and one or more terms, each a decimal number with an optional
    fraction and a unit: ``ns``, ``us`` (or ``µs``), ``ms``, ``s``, ``m``, ``h`` and ``d``, in any
    order (``"1.5h"``, ``"1h30m"``, ``"250ms"``, ``"2h45m30.5s"``); ``"0"`` alone is zero.
    Anything else raises ``ValueError``, and so does a negative duration. The sum is exact to
    the nanosecond (a fraction below it is dropped, as Go does) and capped so its seconds fit a
    PostgreSQL integer (a duration ends up in a deadline column).
    """
    if not isinstance(text, str) or not text or len(text) > 64:
        raise ValueError(f"not a duration: {quote(text)}")
    body = text[1:] if text[0] in "+-" else text
    if body == "0":
        return 0.0
    total_ns = 0
    pos = 0
    while True:
        match = _DURATION_TERM_RE.match(body, pos)
        # A unit needs a number before it: "s", ".s" and a bare sign are not durations.
        if match is None or not (match[1] or match[2]):
            raise ValueError(f"not a duration: {quote(text)}")
        whole, fraction, unit = match.groups()
        per_unit = _NS_PER_UNIT[unit]
        total_ns += int(whole or "0") * per_unit
        if fraction:
            total_ns += int(fraction) * per_unit // 10 ** len(fraction)
        pos = match.end()
        if pos == len(body):
            break
    if text[0] == "-" and total_ns:
        raise ValueError(f"duration is negative: {quote(text)}")
    if total_ns > MAX_INT * _NS_PER_SECOND:
        raise ValueError(f"duration too long: {quote(text)}")
    return total_ns / _NS_PER_SECOND


def check_duration(value: object, path: str) -> float:
    """A positive duration in seconds, which may be a fraction of a second (``"250ms"`` is 0.25);
    each user of it says how it rounds, if it must."""
    try:
        seconds = parse_duration(value)  # type: ignore[arg-type]
    except ValueError:
        seconds = 0.0
    if seconds <= 0:  # a zero timeout would fail the run or the ask at once
        fail(f"{path} must be {DURATION_RULE}, got {quote(value)}")
    return seconds


# -------------------------------------------------------------------------------------- JSON


class _NotJSON(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJSON(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJSON(f"the number {text[:40]} is too large")
    return value


def parse_json(raw: bytes | str, what: str = "body") -> Any:
    """Strict JSON (RFC 8259): no ``NaN``/``Infinity``, no number too large for a double — none of
    them can be stored or compared — and no nesting past the bound; else ``BadRequest`` naming
    ``what`` (a 400, never a 500: docs/api.md#conventions)."""
    try:
        doc = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise BadRequest(f"JSON nesting deeper than {MAX_DEPTH}") from None
    except _NotJSON as exc:
        raise BadRequest(f"{what}: {exc}") from None
    except ValueError:
        raise BadRequest(f"{what} is not valid JSON") from None
    check_json_depth(doc)
    return doc


def check_json_depth(obj: object, max_depth: int = MAX_DEPTH) -> None:
    """Raise ``BadRequest`` when objects/arrays nest deeper than ``max_depth``
    (docs/contract.md#limits).

    Iterative on purpose: a recursive walk is exactly what a hostile document would overflow.
    The outermost container is depth 1.
    """
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Iterable[object] = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            raise BadRequest(f"JSON nesting deeper than {max_depth}")
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def _unstorable(text: str) -> str | None:
    """What keeps PostgreSQL from storing ``text`` in a text or jsonb value, or None: a NUL, or
    a lone surrogate (JSON's ``"\\ud800"``), which has no UTF-8 encoding."""
    if "\x00" in text:
        return "a NUL character"
    if _SURROGATE_RE.search(text) is not None:
        return "a lone surrogate"
    return None


def _holds_unstorable(obj: object) -> bool:
    """Whether any key or string in ``obj`` holds what :func:`_unstorable` names: all of them
    searched at once."""
    texts: list[str] = []
    stack = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            texts.append(node)
        elif isinstance(node, dict):
            texts.extend(node)  # its keys (JSON's are strings; anything else is skipped below)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    joined = "".join(t for t in texts if isinstance(t, str))
    return _UNSTORABLE_RE.search(joined) is not None


def check_no_nul(obj: object) -> None:
    """Raise ``BadRequest`` naming the field when a key or string holds a NUL character or a lone
    surrogate, which no PostgreSQL text or jsonb value can store (a 4xx, never a 500:
    docs/security.md#input-and-load).
    Iterative, like :func:`check_json_depth`, which bounds the depth first."""
    if not _holds_unstorable(obj):
        return  # the common case, found without building a path for every value
    stack: list[tuple[object, str]] = [(obj, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            problem = _unstorable(node)
            if problem:
                raise BadRequest(f"{path or 'body'}: a string may not contain {problem}")
        elif isinstance(node, dict):
            for key, child in node.items():
                problem = _unstorable(key)
                if problem:
                    raise BadRequest(f"{path or 'body'}: a key may not contain {problem}")
                stack.append((child, f"{path}.{key}" if path else key))
        elif isinstance(node, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node))


# ------------------------------------------------------------------------------ requirements


def parse_requirement(
    obj: object,
    path: str = "requirement",
    *,
    capabilities: Collection[str] = (),
    need_as: bool = True,
) -> Role:
    """A requirement (a ``requires`` entry, an acquire's ``want``, a ``fleet_has``) as a Role.

    One flat object: ``as``, ``capability``, ``count`` and string attributes. When
    ``capabilities`` is non-empty, any other capability name is ``unknown capability: "x"``
    (docs/contract.md#requirements-and-how-runs-are-placed). Public so the acquire step and the
    verdict read the flat wire form the same way.
    """
    known = frozenset(capabilities)
    req = check_dict(obj, path)
    name = ""
    if "as" in req:
        name = req["as"]
        if not is_name(name):
            fail(f"{path}.as must be {NAME_RULE}, got {quote(name)}")
    elif need_as:
        fail(f"{path}.as is required")
    capability = require(req, "capability", f"{path}.capability")
    if not is_capability(capability):
        fail(f"{path}.capability must match {CAPABILITY_RULE}, got {quote(capability)}")
    if known and capability not in known:
        fail(f"unknown capability: {quote(capability)}")
    # A count of 0 means 1, as the original system reads it
    # (docs/contract.md#requirements-and-how-runs-are-placed).
    count = check_int(req.get("count", 1), f"{path}.count", 0) or 1
    attrs: dict[str, str] = {}
    for key, value in req.items():
        if key in _ROLE_FIELDS:
            continue
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_NAME:
            fail(f"{path}: attribute names must be 1-200 characters, got {quote(key)}")
        if not isinstance(value, str) or utf8_len(value) > MAX_ATTR_BYTES:
            fail(f"{subpath(path, key)} must be a string of at most 1024 bytes, got {quote(value)}")
        attrs[key] = value
    return Role(name=name, capability=capability, count=count, attrs=attrs)


def requires_key(roles: Iterable[Role]) -> str:
    """The queue's shape key of a run's normalised ``requires`` (docs/design.md#the-queue).

    sha256 hex of the canonical JSON (sorted keys, no spaces) of ``[[name, capability, count,
    sorted attrs], ...]`` in contract order; the order of attributes in the document cannot
    change it.
    """
    shape = [[role.name, role.capability, role.count, sorted(role.attrs.items())] for role in roles]
    canonical = json.dumps(shape, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
