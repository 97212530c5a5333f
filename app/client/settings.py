"""Where the client commands find the Mediator, their token and their principal.

Each of ``url``, ``token`` and ``principal`` is taken from the first of these that gives it:

1. the command line: ``--url``, ``--token``, ``--principal``;
2. the client's own variables: ``MEDIATOR_CLIENT_URL``, ``MEDIATOR_CLIENT_TOKEN``,
   ``MEDIATOR_CLIENT_PRINCIPAL``;
3. the older shared variables ``MEDIATOR_URL``, ``MEDIATOR_TOKEN``, ``MEDIATOR_PRINCIPAL`` (still
   read; but a server started from the same shell takes ``MEDIATOR_TOKEN`` as its all-roles
   legacy token, which the client's own names avoid);
4. the profile: ``--profile``, else ``MEDIATOR_CLIENT_PROFILE``, else the file's ``default``, of
   the client configuration file (``MEDIATOR_CLIENT_CONFIG``, else
   ``$XDG_CONFIG_HOME/mediator/client.toml``, else ``~/.config/mediator/client.toml``);
5. the defaults: ``http://127.0.0.1:8080``, no token, ``git config user.email``.

The file, in TOML::

    default = "lab"

    [profiles.lab]
    url = "https://mediator.lab.example"
    token_file = "~/.config/mediator/lab.token"   # or token = "..."
    principal = "me@lab.example"

A mistake in it is a :class:`SettingsError` whose one line names the file and the key; a token
that cannot be read or sent (its file, its characters) is a :class:`TokenError`, which names
where the token came from and never the token.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.config_loader import FileMessages, from_environment, read_mapping

DEFAULT_URL = "http://127.0.0.1:8080"
FIELDS = ("url", "token", "principal")
PROFILE_KEYS = frozenset({"url", "token", "token_file", "principal"})
# The client's own variables, then the older ones that the agent and the server read too.
VARIABLES = {
    "url": ("MEDIATOR_CLIENT_URL", "MEDIATOR_URL"),
    "token": ("MEDIATOR_CLIENT_TOKEN", "MEDIATOR_TOKEN"),
    "principal": ("MEDIATOR_CLIENT_PRINCIPAL", "MEDIATOR_PRINCIPAL"),
}
PROFILE_VARIABLE = "MEDIATOR_CLIENT_PROFILE"
CONFIG_VARIABLE = "MEDIATOR_CLIENT_CONFIG"


class SettingsError(Exception):
    """A client configuration the commands cannot use; the message names the file and key."""


class TokenError(SettingsError):
    """A token the client cannot read (its file) or send (a character no HTTP header carries)."""


def sendable(token: str) -> bool:
    """Whether ``token`` can go in an ``Authorization`` header as the Mediator reads it: printable
    ASCII only (no control character, no line break, nothing beyond ASCII)."""
    return all(" " <= c <= "~" for c in token)


@dataclass(frozen=True)
class Settings:
    """What the commands use, and where each came from (``--url``, a variable's name, the
    profile's key, ``default``): ``mediator profiles`` shows it, never the token itself."""

    url: str
    token: str | None
    principal: str | None
    profile: str | None
    sources: Mapping[str, str]
    warnings: tuple[str, ...] = ()


def config_path(env: Mapping[str, str]) -> Path:
    """The client configuration file of this environment (it need not exist)."""
    given = env.get(CONFIG_VARIABLE)
    if given:
        return Path(given).expanduser()
    # XDG Base Directory: a relative $XDG_CONFIG_HOME is invalid and ignored.
    xdg = env.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path(env.get("HOME") or "~") / ".config"
    return base.expanduser() / "mediator" / "client.toml"


FILE_MESSAGES = FileMessages(
    cannot_read="{path}: cannot read it: {reason}",
    cannot_parse="{path}: not valid TOML: {reason}",
    not_a_mapping="{path}: must hold a mapping of keys",  # TOML always does
)


def read_profiles(path: Path) -> tuple[dict[str, dict[str, Any]], str | None]:
    """The profiles of ``path`` by name and its ``default``; none when there is no file."""
    doc = read_mapping(path, FILE_MESSAGES, SettingsError, syntax="toml", missing_ok=True)
    unknown = sorted(set(doc) - {"default", "profiles"})
    if unknown:
        raise SettingsError(f"{path}: {unknown[0]}: unknown key (default, profiles)")
    default = doc.get("default")
    if default is not None and not isinstance(default, str):
        raise SettingsError(f"{path}: default: must be the name of a profile")
    profiles = doc.get("profiles", {})
    if not isinstance(profiles, dict):
        raise SettingsError(f"{path}: profiles: must be tables [profiles.NAME]")
    for name, profile in profiles.items():
        _check_profile(path, name, profile)
    if default is not None and default not in profiles:
        raise SettingsError(f"{path}: default: no profile {default!r}")
    return profiles, default


def _check_profile(path: Path, name: str, profile: Any) -> None:
    where = f"{path}: profiles.{name}"
    if not isinstance(profile, dict):
        raise SettingsError(f"{where}: must be a table of {', '.join(sorted(PROFILE_KEYS))}")
    unknown = sorted(set(profile) - PROFILE_KEYS)
    if unknown:
        keys = ", ".join(sorted(PROFILE_KEYS))
        raise SettingsError(f"{where}.{unknown[0]}: unknown key ({keys})")
    for key, value in profile.items():
        if not isinstance(value, str) or not value:
            raise SettingsError(f"{where}.{key}: must be a non-empty string")
    if "token" in profile and "token_file" in profile:
        raise SettingsError(f"{where}: token and token_file: give one of them")
    url = profile.get("url")
    if url is not None and not url.startswith(("http://", "https://")):
        raise SettingsError(f"{where}.url: must be an http:// or https:// URL, got {url!r}")


def _token_of_file(path: Path, where: str) -> str:
    """The first line of a token file (a trailing newline or comment lines after it are fine)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TokenError(f"{where}: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise TokenError(f"{where}: {path} is not UTF-8 text") from None
    lines = text.strip().splitlines()
    if not lines or not lines[0].strip():
        raise TokenError(f"{where}: {path} is empty")
    return lines[0].strip()


def readable_by_others(path: Path) -> bool:
    """Whether users other than the owner may read ``path`` (group or other read bits)."""
    try:
        return bool(path.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH))
    except OSError:
        return False


def resolve(
    given: Mapping[str, str | None],
    env: Mapping[str, str],
    profile: str | None = None,
) -> Settings:
    """The settings of one command: ``given`` holds the command line's ``url``, ``token`` and
    ``principal`` (None when not given), ``profile`` the command line's ``--profile``."""
    values: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    for name, (value, variable) in from_environment(env, VARIABLES).items():
        values[name], sources[name] = value, variable
    for name in FIELDS:
        if given.get(name):
            values[name], sources[name] = given[name], f"--{name}"
    path = config_path(env)
    chosen, chosen_by = profile, "--profile"
    holder: Path | None = None  # the file the token was read from
    if not chosen and env.get(PROFILE_VARIABLE):
        chosen, chosen_by = env[PROFILE_VARIABLE], PROFILE_VARIABLE
    if chosen or any(name not in values for name in FIELDS):
        profiles, default = read_profiles(path)
        if not chosen:
            chosen, chosen_by = default, f"default in {path}"
        if chosen:
            if chosen not in profiles:
                known = ", ".join(sorted(profiles)) or "none"
                raise SettingsError(
                    f"{chosen_by}: no profile {chosen!r} in {path} (its profiles: {known})"
                )
            where = f"{path}: profiles.{chosen}"
            holder = _fill_from_profile(values, sources, profiles[chosen], where, path)
    if not values.get("url"):
        values["url"], sources["url"] = DEFAULT_URL, "default"
    token = values.get("token")
    if token is not None and not sendable(token):
        raise TokenError(
            f"{sources['token']}: the token holds a character an HTTP header cannot carry "
            "(a control character or line break, or one beyond ASCII)"
        )
    return Settings(
        url=str(values["url"]),
        token=values.get("token"),
        principal=values.get("principal"),
        profile=chosen or None,
        sources=sources,
        warnings=(
            (f"{holder} holds a token and other users may read it (chmod 600 {holder})",)
            if holder is not None and readable_by_others(holder)
            else ()
        ),
    )


def _fill_from_profile(
    values: dict[str, str | None],
    sources: dict[str, str],
    profile: Mapping[str, str],
    where: str,
    path: Path,
) -> Path | None:
    """Fill what is still missing from ``profile``; returns the file the token came from."""
    for name in ("url", "principal"):
        if name not in values and profile.get(name):
            values[name], sources[name] = profile[name], f"{where}.{name}"
    if "token" in values:
        return None
    if profile.get("token"):
        values["token"], sources["token"] = profile["token"], f"{where}.token"
        return path
    if profile.get("token_file"):
        token_path = Path(profile["token_file"]).expanduser()
        values["token"] = _token_of_file(token_path, f"{where}.token_file")
        sources["token"] = f"{where}.token_file ({token_path})"
        return token_path
    return None
