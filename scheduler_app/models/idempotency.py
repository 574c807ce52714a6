"""Idempotency keys of job submissions: a retried POST with the same key gets the first answer back."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from scheduler_app.models.jobs import Job

MAX_IDEMPOTENCY_KEY_CHARS = 255


class IdempotencyKey(models.Model):
    """One user's `Idempotency-Key` (IETF draft "The Idempotency-Key HTTP Header Field", Stripe's keys)
    and the answer its first request got.

    Inserted in the transaction that creates the job(s), so a key exists exactly when its submission
    was committed. `request_digest` is the SHA-256 of the request's canonical JSON: the same key with a
    different body is refused, not replayed. `status_code` and `response_body` are what the first
    request answered; a retry gets them verbatim. Rows older than the retention
    (`idempotency_key_ttl_h`) are deleted by the hourly task and ignored before that.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=MAX_IDEMPOTENCY_KEY_CHARS)
    request_digest = models.CharField(max_length=64, help_text="SHA-256 (hex) of the request's JSON")
    status_code = models.PositiveSmallIntegerField(default=0, help_text="The first answer's; 0 while it runs")
    response_body = models.JSONField(null=True, blank=True)
    # The job submitted (an array's first task); kept out of its deletion's way.
    job = models.ForeignKey(Job, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            # The one line of defence against two concurrent retries both submitting: the second
            # INSERT waits on this index for the first transaction and then fails (services/idempotency.py).
            models.UniqueConstraint(fields=["owner", "key"], name="idempotency_key_unique_per_owner"),
        ]

    def __str__(self) -> str:
        return f"{self.owner_id}:{self.key}"
