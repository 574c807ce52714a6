"""`{% as_of at %}`: as of when an estimate holds, "as of 12:04, 3 min ago" (services/forecast_as_of.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from cli.output import ago_words
from scheduler_app.models import Job
from scheduler_app.services.forecast_as_of import job_estimate_as_of

register = template.Library()

# Older than this, the day is shown too ("as of 2026-11-29 23:50").
TIME_ONLY_WITHIN = timedelta(hours=12)


def as_of_words(at: datetime, now: datetime | None = None) -> tuple[str, str]:
    """(the time, how long ago): ("12:04", "3 min ago"); the day too when it is another day or long
    ago; "just now" under a minute."""
    now = now or timezone.now()
    local, local_now = timezone.localtime(at), timezone.localtime(now)
    same_day = local.date() == local_now.date() and now - at < TIME_ONLY_WITHIN
    clock = local.strftime("%H:%M") if same_day else local.strftime("%Y-%m-%d %H:%M")
    return clock, ago_words((now - at).total_seconds())


@register.simple_tag
def as_of(at: datetime | None) -> SafeString | str:
    """ "as of 12:04, 3 min ago", the time whole on hover; "" when `at` is None (no estimate). A span,
    not a `<time>`: the estimate's own `<time>` stays the one in its element (`#estimated-start time`)."""
    if at is None:
        return ""
    clock, ago = as_of_words(at)
    return format_html('as of <span class="as-of" title="{}">{}</span>, {}', at.isoformat(), clock, ago)


@register.simple_tag
def job_as_of(job: Job, confirmed_at: datetime | None) -> str:
    """A live job's estimate's "as of 12:04, 3 min ago" as plain text (for a title), given the last
    finished refresh's time (read once for the page); "" without an estimate."""
    at = job_estimate_as_of(job, lambda: confirmed_at)
    if at is None:
        return ""
    clock, ago = as_of_words(at)
    return f"as of {clock}, {ago}"
