"""The SECRET_KEY rule: with DEBUG off, no service process starts on a key that everybody knows."""

from __future__ import annotations

from django.conf import settings
from django.core import checks

# settings.py's fallback, fit only for the embedded demo (DEBUG=1), and .env.example's placeholder.
DEMO_SECRET_KEY = "django-insecure-attune-local-demo-key-change-me"
EXAMPLE_SECRET_KEY = "change-me-to-a-long-random-string"
PUBLIC_SECRET_KEYS = frozenset({DEMO_SECRET_KEY, EXAMPLE_SECRET_KEY})
MIN_SECRET_KEY_CHARS = 32
HOW_TO_FIX = (
    "set SECRET_KEY in .env to a long random string, e.g. the output of "
    "`python -c 'import secrets; print(secrets.token_urlsafe(50))'` (docs/deploy.md, \"Secrets\")"
)


def secret_key_problem(key: str, *, debug: bool) -> str | None:
    """Why `key` must not sign this service's sessions, tokens' forms and password resets; None if it may.

    With DEBUG on (the embedded demo on 127.0.0.1) any key goes. Off, the shipped keys are public (they
    are in the repository), so anyone could forge a session cookie of any user, the admin's included.
    """
    if debug:
        return None
    if not key.strip():
        return "SECRET_KEY is empty"
    if key in PUBLIC_SECRET_KEYS:
        return "SECRET_KEY is the repository's public default"
    if len(key) < MIN_SECRET_KEY_CHARS:
        return f"SECRET_KEY has {len(key)} characters, fewer than {MIN_SECRET_KEY_CHARS}"
    return None


def secret_key_refuse() -> None:
    """Exit with the reason when this process must not serve (gunicorn's master, Celery worker and beat):
    called at their start, before they take a request or a task."""
    problem = secret_key_problem(settings.SECRET_KEY, debug=settings.DEBUG)
    if problem:
        raise SystemExit(f"attune: refusing to start with DEBUG=0: {problem}; {HOW_TO_FIX}")


@checks.register(checks.Tags.security, deploy=True)
def secret_key_check(app_configs=None, **_kwargs) -> list[checks.CheckMessage]:
    """`manage.py check --deploy` fails (an error, not Django's warning W009) on the same keys."""
    problem = secret_key_problem(settings.SECRET_KEY, debug=settings.DEBUG)
    if not problem:
        return []
    message = f"{problem}: the service refuses to start with DEBUG=0"
    return [checks.Error(message, hint=HOW_TO_FIX, id="attune.E001")]
