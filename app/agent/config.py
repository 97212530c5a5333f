"""The node agent's configuration: the advert (``node_id``, ``label``, ``capabilities``) and the
agent's own settings, from a YAML file in the advert's shape, the environment and flags; flags win
over the environment, the environment over the file. The agent's own variables
(``MEDIATOR_AGENT_URL``, ``MEDIATOR_AGENT_TOKEN``, ``MEDIATOR_AGENT_PRINCIPAL``) win over the
older shared ones (``MEDIATOR_URL``, ``MEDIATOR_TOKEN``, ``MEDIATOR_PRINCIPAL``), which are still
read: a server started from the same shell takes ``MEDIATOR_TOKEN`` as its all-roles legacy
token, and never reads the agent's names.

A mistake is an :class:`AgentConfigError` with one line naming the key, before anything is sent.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.config_loader import (
    FileMessages,
    as_bool,
    as_str,
    coerce,
    from_environment,
    one_of,
    read_mapping,
)
from app.names import CAPABILITY_RE, CAPABILITY_RULE, NAME_RE, NAME_RULE

DEFAULT_URL = "http://127.0.0.1:8080"
# What a step's PATH is unless its contract names PATH among its ``env``: enough to find the
# usual tools, nothing of the agent's own environment.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

# Node ids share the run id grammar (docs/contract.md#top-level); capability names
# are those of docs/contract.md#requirements-and-how-runs-are-placed.
NODE_ID = NAME_RE
CAPABILITY = CAPABILITY_RE
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

FILE_KEYS = frozenset(
    {
        "node_id",
        "label",
        "capabilities",
        "url",
        "token",
        "principal",
        "work_dir",
        "keep_work_dirs",
        "drain_file",
        "harness",
        "path",
        "claim_wait_seconds",
        "kill_after_seconds",
        "log_format",
        "log_level",
    }
)


# Each setting's variables, the first set wins: the agent's own name, then the shared one.
VARIABLES = {
    "url": ("MEDIATOR_AGENT_URL", "MEDIATOR_URL"),
    "token": ("MEDIATOR_AGENT_TOKEN", "MEDIATOR_TOKEN"),
    "principal": ("MEDIATOR_AGENT_PRINCIPAL", "MEDIATOR_PRINCIPAL"),
}


class AgentConfigError(Exception):
    """A configuration the agent cannot start with; the message names the key."""


@dataclass(frozen=True)
class Capability:
    capability: str
    attrs: Mapping[str, str] = field(default_factory=dict)

    def advert(self) -> dict[str, Any]:
        return {"capability": self.capability, "attrs": dict(self.attrs)}


@dataclass(frozen=True)
class Harness:
    """How this node runs ``agent`` steps: a command (``$IN``, ``$OUT``, ``$PROMPT`` and
    ``$STEP`` are expanded in it), the environment names it needs (API keys), and optionally the
    harness name a step may ask for (``agent.harness``)."""

    command: tuple[str, ...]
    env: tuple[str, ...] = ()
    name: str | None = None


@dataclass(frozen=True)
class AgentConfig:
    node_id: str
    capabilities: tuple[Capability, ...]
    url: str = DEFAULT_URL
    token: str | None = None
    principal: str | None = None
    label: str | None = None
    work_dir: Path | None = None  # None: the system's temporary directory
    keep_work_dirs: bool = False
    drain_file: Path | None = None
    harness: Harness | None = None
    path: str = DEFAULT_PATH
    claim_wait_seconds: float = 10.0
    kill_after_seconds: float = 10.0
    log_format: str = "console"
    log_level: str = "info"

    def advert(self, instance: str, drain: str) -> dict[str, Any]:
        """The advert body (docs/api.md#post-v1nodes--advertise-the-heartbeat): it replaces the
        previous one completely."""
        body: dict[str, Any] = {
            "node_id": self.node_id,
            "instance": instance,
            "capabilities": [c.advert() for c in self.capabilities],
            "policy": {"drain": drain},
        }
        if self.label:
            body["label"] = self.label
        return body


# ---------------------------------------------------------------- pieces


def parse_capability_flag(text: str) -> Capability:
    """``NAME`` or ``NAME:k=v,k2=v2`` (the ``--capability`` flag)."""
    name, _, rest = text.partition(":")
    name = name.strip()
    if not CAPABILITY.fullmatch(name):
        raise AgentConfigError(
            f"--capability {text!r}: the name must match {CAPABILITY_RULE}, got {name!r}"
        )
    attrs: dict[str, str] = {}
    for part in rest.split(","):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise AgentConfigError(f"--capability {text!r}: {part!r} is not key=value")
        attrs[key.strip()] = value.strip()
    return Capability(name, attrs)


def _capability(where: str, item: Any) -> Capability:
    if isinstance(item, str):
        return parse_capability_flag(item)
    if not isinstance(item, Mapping):
        raise AgentConfigError(f"{where}: must be {{capability, attrs}}")
    unknown = sorted(set(item) - {"capability", "attrs"})
    if unknown:
        raise AgentConfigError(f"{where}.{unknown[0]}: unknown key (attributes go in attrs)")
    name = item.get("capability")
    if not isinstance(name, str) or not CAPABILITY.fullmatch(name):
        raise AgentConfigError(f"{where}.capability: must match {CAPABILITY_RULE}, got {name!r}")
    attrs = item.get("attrs") or {}
    if not isinstance(attrs, Mapping):
        raise AgentConfigError(f"{where}.attrs: must be a mapping of strings")
    for key, value in attrs.items():
        if not isinstance(key, str) or not isinstance(value, str):
            # YAML reads 1.10 as the number 1.1: a silent conversion would advertise the wrong value.
            raise AgentConfigError(
                f"{where}.attrs.{key}: must be a string (quote it in YAML), got {value!r}"
            )
    return Capability(name, dict(attrs))


def _harness(item: Any) -> Harness | None:
    if item is None:
        return None
    if isinstance(item, list):
        item = {"command": item}
    if not isinstance(item, Mapping):
        raise AgentConfigError("harness: must be {command: [argv], env: [names], name}")
    unknown = sorted(set(item) - {"command", "env", "name"})
    if unknown:
        raise AgentConfigError(f"harness.{unknown[0]}: unknown key")
    command = item.get("command")
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(a, str) and a for a in command)
    ):
        raise AgentConfigError("harness.command: must be a non-empty list of strings (argv)")
    env = _names("harness.env", item.get("env") or [])
    name = item.get("name")
    if name is not None and not isinstance(name, str):
        raise AgentConfigError("harness.name: must be a string")
    return Harness(tuple(command), env, name or None)


def _names(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(
        isinstance(n, str) and ENV_NAME.fullmatch(n) for n in value
    ):
        raise AgentConfigError(f"{where}: must be a list of environment variable names")
    return tuple(value)


def _text(where: str, value: Any) -> str | None:
    return coerce(where, value, as_str, AgentConfigError)


def _as_seconds(name: str, value: Any) -> float:
    # Stricter than the server's numbers: the agent's seconds come from its file and flags only.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError("must be a number of seconds (0 or more)")
    return float(value)


def _seconds(where: str, value: Any, default: float) -> float:
    return default if value is None else coerce(where, value, _as_seconds, AgentConfigError)


def _choice(where: str, value: Any, default: str, allowed: Sequence[str]) -> str:
    if value is None:
        return default
    problem = one_of(*allowed)(value)
    if problem:
        raise AgentConfigError(f"{where}: {problem}, got {value!r}")
    return str(value)


FILE_MESSAGES = FileMessages(
    cannot_read="--config: cannot read {path}: {reason}",
    cannot_parse="--config: cannot parse {path}: {reason}",
    not_a_mapping="--config: {path} must hold a mapping of keys",
)


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The keys of the agent's YAML file (whatever its suffix), each one the agent knows."""
    data = read_mapping(path, FILE_MESSAGES, AgentConfigError, syntax="yaml")
    unknown = sorted(set(data) - FILE_KEYS)
    if unknown:
        raise AgentConfigError(f"{unknown[0]}: unknown key in {Path(path)}")
    return data


# ---------------------------------------------------------------- the whole


def load_agent_config(
    path: str | os.PathLike[str] | None,
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
) -> AgentConfig:
    """The file (``path``), then the environment (:data:`VARIABLES`), then ``flags`` (keys of the
    file; None = not given; ``capabilities`` a list of ``--capability`` texts, replacing the
    file's list when non-empty)."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = read_file(path) if path else {}
    raw.update((key, value) for key, (value, _) in from_environment(env, VARIABLES).items())
    for key, value in flags.items():
        if value is None or (key == "capabilities" and not value):
            continue
        raw[key] = list(value) if key == "capabilities" else value

    node_id = raw.get("node_id")
    if not node_id:
        raise AgentConfigError("node_id: missing (--node-id ID or node_id: in --config)")
    if not isinstance(node_id, str) or not NODE_ID.fullmatch(node_id):
        raise AgentConfigError(f"node_id: must be {NAME_RULE}, got {node_id!r}")
    items = raw.get("capabilities")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise AgentConfigError("capabilities: must be a list of {capability, attrs}")
    capabilities = tuple(_capability(f"capabilities[{i}]", c) for i, c in enumerate(items))
    url = _text("url", raw.get("url")) or DEFAULT_URL
    if not url.startswith(("http://", "https://")):
        raise AgentConfigError(f"url: must be an http:// or https:// URL, got {url!r}")
    work_dir = _text("work_dir", raw.get("work_dir"))
    drain_file = _text("drain_file", raw.get("drain_file"))
    keep = coerce("keep_work_dirs", raw.get("keep_work_dirs", False), as_bool, AgentConfigError)
    return AgentConfig(
        node_id=node_id,
        capabilities=capabilities,
        url=url.rstrip("/"),
        token=_text("token", raw.get("token")),
        principal=_text("principal", raw.get("principal")),
        label=_text("label", raw.get("label")),
        work_dir=Path(work_dir).expanduser() if work_dir else None,
        keep_work_dirs=keep,
        drain_file=Path(drain_file).expanduser() if drain_file else None,
        harness=_harness(raw.get("harness")),
        path=_text("path", raw.get("path")) or DEFAULT_PATH,
        claim_wait_seconds=_seconds("claim_wait_seconds", raw.get("claim_wait_seconds"), 10.0),
        kill_after_seconds=_seconds("kill_after_seconds", raw.get("kill_after_seconds"), 10.0),
        log_format=_choice("log_format", raw.get("log_format"), "console", ("console", "json")),
        log_level=_choice(
            "log_level", raw.get("log_level"), "info", ("debug", "info", "warning", "error")
        ),
    )
