"""The embedded demo's set-up around the service: its users' Unix account, its port, its agents' lives."""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model

from scheduler_app.models import UnixAccount

# As root the demo's web users run their own commands as this account, created when missing: one
# account of the demo's own, rather than accounts named admin, alice... on the machine.
DEMO_UNIX_USER = "attune-demo"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here, not in the forked child


@dataclass(frozen=True)
class DemoIdentity:
    """The Unix account the demo users' own commands run as; `unix_user` None when there is none (why)."""

    unix_user: str | None
    home: str
    note: str


def demo_identity_ensure() -> DemoIdentity:
    """Map every demo web user without a mapping to an account that exists, with a home that exists.

    Not root: the agents run this account's jobs only (single-user mode), so that account. Root: the
    account `attune-demo` (useradd when missing; its uid at or above ATTUNE_RUN_AS_MIN_UID, as the
    service and the agents require)."""
    if os.geteuid() != 0:
        entry = pwd.getpwuid(os.geteuid())
        identity = DemoIdentity(entry.pw_name, entry.pw_dir, f"{entry.pw_name} (this account)")
    else:
        identity = _root_identity()
    if identity.unix_user:
        for user in get_user_model().objects.filter(unix_account__isnull=True):
            UnixAccount.objects.create(user=user, unix_user=identity.unix_user)
    return identity


def _root_identity() -> DemoIdentity:
    min_uid = int(settings.ATTUNE_JOB_ACCOUNTS["min_uid"])
    note = ""
    try:
        entry = pwd.getpwnam(DEMO_UNIX_USER)
    except KeyError:
        useradd = shutil.which("useradd")
        if not useradd:
            return DemoIdentity(None, "", f"no account {DEMO_UNIX_USER} and no useradd to create it")
        done = subprocess.run(
            [useradd, "--create-home", "--shell", "/bin/sh", "--comment", "Attune demo jobs", DEMO_UNIX_USER],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            why = done.stderr.strip() or f"exit {done.returncode}"
            return DemoIdentity(None, "", f"useradd {DEMO_UNIX_USER} failed: {why}")
        entry = pwd.getpwnam(DEMO_UNIX_USER)
        note = ", created now"
    if entry.pw_uid < min_uid:
        why = f"{DEMO_UNIX_USER} has uid {entry.pw_uid}, below ATTUNE_RUN_AS_MIN_UID={min_uid}"
        return DemoIdentity(None, "", why)
    home = Path(entry.pw_dir)
    if not home.is_dir():  # an account made without its home: make it, the job's default directory
        home.mkdir(mode=0o750, parents=True)
        os.chown(home, entry.pw_uid, entry.pw_gid)
    return DemoIdentity(entry.pw_name, entry.pw_dir, f"{entry.pw_name} (uid {entry.pw_uid}{note})")


def port_taken(addr: str) -> str | None:
    """Why the web server could not listen on `addr` ("host:port"), or None. Checked before the agents
    start: runserver ends the process with os._exit on a taken port, past any clean-up."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as runserver does
        try:
            probe.bind((host, int(port)))
        except OSError as exc:
            return f"cannot listen on {addr}: {exc.strerror}"
    return None


def die_with_parent() -> None:
    """In a child before exec: SIGTERM when the demo's process ends, however it ends (even os._exit),
    so no agent outlives it holding its spool's lock."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def closed_to_others(path: Path) -> Path | None:
    """The first directory from / down to `path` that other accounts may not enter (no o+x), or None.
    As root, catalog workloads run as nobody with this checkout's packages, and own commands as the
    demo's account: neither can reach a checkout under /root (mode 0700)."""
    for directory in [*reversed(path.resolve().parents), path.resolve()]:
        try:
            if not directory.stat().st_mode & 0o001:
                return directory
        except OSError:
            return directory
    return None


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
