"""Idempotent submissions: a request with a user's Idempotency-Key runs once; a retry gets its answer."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone

from infra.vendor import is_postgresql
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import IdempotencyKey
from scheduler_app.models.idempotency import MAX_IDEMPOTENCY_KEY_CHARS

logger = logging.getLogger(__name__)

# Visible ASCII, no spaces (a UUID, Stripe's keys, the IETF draft's examples); the schema declares the
# same pattern and length for the header.
IDEMPOTENCY_KEY_PATTERN = rf"^[!-~]{{1,{MAX_IDEMPOTENCY_KEY_CHARS}}}$"
_KEY_RE = re.compile(IDEMPOTENCY_KEY_PATTERN)

# How long a retry waits for the first request with its key while that one still runs (its client
# gave up on it, e.g. a dropped connection during the admission forecast) before being answered 409:
# longer than a submission takes (the forecast's budget is 2 s), shorter than a client's timeout (30 s).
IN_PROGRESS_WAIT_S = 10
PG_LOCK_NOT_AVAILABLE = "55P03"


class IdempotencyKeyError(Exception):
    """A request whose key cannot be honoured; `status_code` is the HTTP answer."""

    status_code = 400


class IdempotencyKeyInvalid(IdempotencyKeyError):
    status_code = 400


class IdempotencyKeyInProgress(IdempotencyKeyError):
    """The key's first request has not finished: nothing was done, retry later."""

    status_code = 409


class IdempotencyKeyReused(IdempotencyKeyError):
    """The key was used for another request (IETF draft: 422): nothing was done."""

    status_code = 422


@dataclass(frozen=True)
class IdempotentAnswer:
    """What a request answered: `replayed` when it is the stored answer of the key's first request."""

    status_code: int
    body: Any
    job_id: int | None = None
    replayed: bool = False


def idempotency_key_parse(*, value: str) -> str:
    """The key as sent, if it is one (1 to 255 visible ASCII characters); else IdempotencyKeyInvalid."""
    if not _KEY_RE.match(value):
        raise IdempotencyKeyInvalid(
            f"Give an Idempotency-Key of 1 to {MAX_IDEMPOTENCY_KEY_CHARS} visible ASCII characters "
            "without spaces (a fresh UUID per submission)."
        )
    return value


def idempotency_request_digest(*, data: Any) -> str:
    """SHA-256 of the request's canonical JSON: the same body whatever its keys' order or spacing."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def idempotency_key_run(
    *,
    owner: AbstractBaseUser,
    key: str,
    request_digest: str,
    execute: Callable[[], IdempotentAnswer],
    now: datetime | None = None,
) -> IdempotentAnswer:
    """Run `execute` once per (owner, key): the first request runs it and its answer is stored with the
    key in the same transaction as what it created; a later one with the same body gets that answer
    (`replayed`), one with another body IdempotencyKeyReused, and one that comes while the first still
    runs waits for it (IdempotencyKeyInProgress after IN_PROGRESS_WAIT_S).

    1. Claim: INSERT the key's row first, in this transaction. The unique index makes a concurrent
       INSERT of the same (owner, key) wait until this transaction ends: if it commits, that one sees
       the row and replays; if it rolls back (a refused request stores nothing), that one runs.
    2. Run `execute` (the submission and its rendering); an exception rolls back the key with the job.
    3. Store the answer on the row; the commit makes the job and its key visible together.
    """
    now = now or timezone.now()
    expired_before = now - timedelta(hours=scheduler_conf().idempotency_key_ttl_h)
    with transaction.atomic():
        row = None
        for _ in range(3):  # a row deleted (expired, pruned) between our INSERT and SELECT: claim again
            row = _claim(owner=owner, key=key, request_digest=request_digest, now=now)
            if row is not None:
                break
            first = IdempotencyKey.objects.select_for_update().filter(owner=owner, key=key).first()
            if first is None:
                continue
            if first.created_at >= expired_before:
                return _replay(first, key=key, request_digest=request_digest)
            # Expired but not pruned yet: the key is free again. Our row lock keeps others waiting.
            first.delete()
        if row is None:
            raise IdempotencyKeyInProgress(f"A request with Idempotency-Key “{key}” is in progress; retry.")
        answer = execute()
        row.status_code = answer.status_code
        row.response_body = answer.body
        row.job_id = answer.job_id
        row.save(update_fields=["status_code", "response_body", "job"])
    return answer


def idempotency_keys_prune(*, now: datetime | None = None) -> int:
    """Delete keys past their retention (`idempotency_key_ttl_h`); returns how many. Hourly."""
    now = now or timezone.now()
    before = now - timedelta(hours=scheduler_conf().idempotency_key_ttl_h)
    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=before).delete()
    return deleted


def _claim(*, owner: AbstractBaseUser, key: str, request_digest: str, now: datetime) -> IdempotencyKey | None:
    """The key's new row, or None when another request's row is committed; IdempotencyKeyInProgress
    when another transaction holds it for longer than IN_PROGRESS_WAIT_S."""
    postgres = is_postgresql()
    if postgres:
        # Bound the wait on the other transaction's uncommitted row (a lock wait on its transaction
        # id, which lock_timeout covers) to this INSERT only: set before the savepoint, since a
        # savepoint's rollback would undo it, and restored after it.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
                [f"{IN_PROGRESS_WAIT_S}s"],
            )
            previous = cursor.fetchone()[0]
    try:
        with transaction.atomic():  # a savepoint: the failed INSERT must not abort the transaction
            return IdempotencyKey.objects.create(
                owner=owner, key=key, request_digest=request_digest, created_at=now
            )
    except IntegrityError:
        return None
    except OperationalError as exc:
        if getattr(exc.__cause__, "pgcode", None) == PG_LOCK_NOT_AVAILABLE:
            raise IdempotencyKeyInProgress(
                f"A request with Idempotency-Key “{key}” is still in progress; retry in a few seconds."
            ) from exc
        raise
    finally:
        if postgres:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])


def _replay(first: IdempotencyKey, *, key: str, request_digest: str) -> IdempotentAnswer:
    if first.request_digest != request_digest:
        raise IdempotencyKeyReused(
            f"Idempotency-Key “{key}” was used for another request: send a new key with a new submission "
            "(a retry must repeat the first request's body exactly)."
        )
    logger.info("idempotency key %s of user %s: replayed (job %s)", key, first.owner_id, first.job_id)
    return IdempotentAnswer(
        status_code=first.status_code, body=first.response_body, job_id=first.job_id, replayed=True
    )
