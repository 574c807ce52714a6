"""With DEBUG=0 the service refuses a public or empty SECRET_KEY: gunicorn, Celery and check --deploy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from config.secret_key import DEMO_SECRET_KEY, EXAMPLE_SECRET_KEY, secret_key_problem

ROOT = Path(__file__).resolve().parents[2]
GOOD_KEY = "k3Qw-9fZ_u2nXbT7rLp0sVd4hJc8mYe1aGo6iNq5tRwUz"


def _env(**values: str) -> dict[str, str]:
    # Not the browser tests' DJANGO_ALLOW_ASYNC_UNSAFE either (tests/browser_support.py): a deployment
    # has no such thing, and `check --deploy` says so (async.E001).
    scrubbed = ("SECRET_KEY", "DEBUG", "DJANGO_ALLOW_ASYNC_UNSAFE")
    env = {k: v for k, v in os.environ.items() if k not in scrubbed}
    return {**env, "DJANGO_SETTINGS_MODULE": "config.settings", **values}


def _run(argv: list[str], **values: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=_env(**values), capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize(
    ("key", "debug", "refused"),
    [
        (DEMO_SECRET_KEY, False, "public default"),
        (EXAMPLE_SECRET_KEY, False, "public default"),
        ("", False, "empty"),
        ("   ", False, "empty"),
        ("short-key", False, "fewer than 32"),
        (GOOD_KEY, False, None),
        (DEMO_SECRET_KEY, True, None),  # the embedded demo on 127.0.0.1
    ],
)
def test_which_keys_are_refused(key: str, debug: bool, refused: str | None):
    problem = secret_key_problem(key, debug=debug)
    assert (problem is None) if refused is None else (refused in problem)


@pytest.mark.parametrize("key", ["", DEMO_SECRET_KEY])
def test_gunicorn_exits_non_zero_and_says_why(key: str):
    env = {"DEBUG": "0", "ATTUNE_BIND": "127.0.0.1:0", "WEB_CONCURRENCY": "1"}
    if key:
        env["SECRET_KEY"] = key  # unset: the settings' default
    done = _run([sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py"], **env)
    assert done.returncode != 0
    assert "refusing to start with DEBUG=0" in done.stderr
    assert "SECRET_KEY" in done.stderr and "docs/deploy.md" in done.stderr
    assert "Booting worker" not in done.stderr  # refused in the master, before any worker served


@pytest.mark.parametrize("kind", ["worker", "beat"])
def test_celery_worker_and_beat_exit_non_zero_and_say_why(kind: str, tmp_path: Path):
    argv = [sys.executable, "-m", "celery", "-A", "config", kind, "--loglevel", "WARNING"]
    argv += ["--pool", "solo"] if kind == "worker" else ["--schedule", str(tmp_path / "beat")]
    done = _run(argv, DEBUG="0", SECRET_KEY=EXAMPLE_SECRET_KEY)
    assert done.returncode != 0
    assert "refusing to start with DEBUG=0: SECRET_KEY is the repository's public default" in (
        done.stdout + done.stderr
    )


def test_check_deploy_fails_on_the_default_key_and_passes_on_a_real_one():
    manage = [sys.executable, "manage.py", "check", "--deploy"]
    refused = _run(manage, DEBUG="0")
    assert refused.returncode != 0
    assert "attune.E001" in refused.stderr and "public default" in refused.stderr
    accepted = _run(manage, DEBUG="0", SECRET_KEY=GOOD_KEY)
    assert accepted.returncode == 0, accepted.stderr
    assert "attune.E001" not in accepted.stderr + accepted.stdout
    # The demo (DEBUG=1) keeps its zero-setup default.
    assert _run(manage, DEBUG="1").returncode == 0
