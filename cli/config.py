"""Where the service is and who the user is: flags, then environment, then the saved login."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SERVER = "http://127.0.0.1:8000"
INSTALLED_NAME = "attune"  # the console script of the attune-cli distribution (packaging/cli)


def program() -> str:
    """How the user typed this program, for help and hints: `attune` once installed, else `python -m cli`."""
    return INSTALLED_NAME if Path(sys.argv[0]).name == INSTALLED_NAME else "python -m cli"


def token_path() -> Path:
    """$ATTUNE_TOKEN_FILE, else $XDG_CONFIG_HOME/attune/token (~/.config/attune/token)."""
    explicit = os.environ.get("ATTUNE_TOKEN_FILE")
    if explicit:
        return Path(explicit)
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "attune" / "token"


@dataclass(frozen=True)
class Settings:
    server: str
    token: str | None


def resolve(*, server: str | None, token: str | None) -> Settings:
    """--server / --token win; then $ATTUNE_SERVER / $ATTUNE_TOKEN; then what `login` saved."""
    saved_server, saved_token = _read_saved()
    return Settings(
        server=(server or os.environ.get("ATTUNE_SERVER") or saved_server or DEFAULT_SERVER).rstrip("/"),
        token=token or os.environ.get("ATTUNE_TOKEN") or saved_token,
    )


def _read_saved() -> tuple[str | None, str | None]:
    try:
        lines = token_path().read_text().split()
    except OSError:
        return None, None
    if len(lines) != 2:
        return None, None
    return lines[0], lines[1]


def save_login(*, server: str, token: str) -> Path:
    """Write the server and token for later commands, readable by this user only."""
    path = token_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Created 0600 before anything is written, so the token is never readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"{server}\n{token}\n")
    os.chmod(path, 0o600)  # an older file may have had wider permissions
    return path
