"""How every process of the Mediator reads its configuration: a file of keys, environment variables
that win over it, and values coerced to their types with one-line errors naming the key.

The server (:mod:`app.config`), the node agent (:mod:`app.agent.config`) and the client commands
(:mod:`app.client.settings`) each keep their own keys, defaults, variables and error messages; this
module is the mechanism they share. It is pure (the standard library and PyYAML): the agent, which
never imports the web framework or the database, uses it too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
# A parser turns a value from a file, a variable or a flag into its type, or raises ValueError
# (or TypeError) whose message says what the value must be; ``name`` is the key, for parsers that
# report more than one field (tokens).
Parser = Callable[[str, Any], T]


@dataclass(frozen=True)
class FileMessages:
    """A reader's error lines, formatted with ``path`` and ``reason``: each process words them its
    own way (the flag or key that named the file) and its tests pin them."""

    cannot_read: str
    cannot_parse: str
    not_a_mapping: str


def read_mapping(
    path: str | os.PathLike[str],
    messages: FileMessages,
    error: type[Exception],
    *,
    syntax: str | None = None,
    missing_ok: bool = False,
) -> dict[str, Any]:
    """The top-level mapping of a YAML or TOML file (``syntax``, else by the suffix: ``.toml`` is
    TOML, anything else YAML); an empty YAML file is an empty mapping, and so is a missing file when
    ``missing_ok``. A mistake raises ``error`` with one line of ``messages``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        if missing_ok:
            return {}
        raise error(messages.cannot_read.format(path=p, reason=exc.strerror)) from None
    except OSError as exc:
        raise error(messages.cannot_read.format(path=p, reason=exc.strerror)) from None
    toml = (syntax or ("toml" if p.suffix.lower() == ".toml" else "yaml")) == "toml"
    try:
        if toml:
            import tomllib

            data: Any = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as exc:  # the parser's own message names the line
        reason = (str(exc).splitlines() or [""])[0]
        raise error(messages.cannot_parse.format(path=p, reason=reason)) from None
    if not isinstance(data, Mapping):
        raise error(messages.not_a_mapping.format(path=p))
    return dict(data)


def from_environment(
    env: Mapping[str, str],
    variables: Mapping[str, Sequence[str]],
    *,
    empty_is_unset: bool = True,
) -> dict[str, tuple[str, str]]:
    """Each key's value and the variable it came from: the first of the key's ``variables`` that
    ``env`` sets. An empty variable counts as not set unless ``empty_is_unset`` is False (the
    server's ``MEDIATOR_*`` keys, where an empty value clears a key)."""
    found: dict[str, tuple[str, str]] = {}
    for key, names in variables.items():
        for name in names:
            if name in env and (env[name] or not empty_is_unset):
                found[key] = (env[name], name)
                break
    return found


def coerce(
    name: str, value: Any, parse: Parser[T], error: type[Exception], *, shown: str = ""
) -> T:
    """``parse(name, value)``; its complaint becomes ``error("<name>: <complaint><shown>")``."""
    try:
        return parse(name, value)
    except (ValueError, TypeError) as exc:
        raise error(f"{name}: {exc}{shown}") from None


# ---------------------------------------------------------------- parsers


def as_int(name: str, v: Any) -> int:
    """An integer, or a string of one (a variable); never a boolean."""
    if isinstance(v, bool):
        raise ValueError("must be an integer")
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v.strip())
    raise ValueError("must be an integer")


def as_float(name: str, v: Any) -> float:
    """A number, or a string of one (a variable); never a boolean."""
    if isinstance(v, bool):
        raise ValueError("must be a number")
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(str(v).strip())
    except ValueError:
        raise ValueError("must be a number") from None


def as_str(name: str, v: Any) -> str | None:
    """A string; None and the empty string are both "not set"."""
    if v is None:
        return None
    if not isinstance(v, str):
        raise ValueError("must be a string")
    return v or None


def as_bool(name: str, v: Any) -> bool:
    """A boolean, or the usual words for one (a variable: ``1``/``true``/``yes``/``on``, …)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in {"1", "true", "yes", "on"}:
        return True
    if isinstance(v, str) and v.strip().lower() in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("must be true or false")


def as_str_list(name: str, v: Any) -> tuple[str, ...]:
    """A list of strings; a variable gives it as JSON (``["a","b"]``) or comma-separated."""
    if isinstance(v, str):
        text = v.strip()
        if text.startswith("["):
            v = json.loads(text)
        else:
            v = [part.strip() for part in text.split(",") if part.strip()]
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise ValueError("must be a list of strings")
    return tuple(v)


def one_of(*allowed: str) -> Callable[[Any], str | None]:
    """A check: None when the value is one of ``allowed``, else what it must be."""
    return lambda v: None if v in allowed else "must be one of " + ", ".join(allowed)
