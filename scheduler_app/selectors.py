"""Every read of the work tables."""

from django.db.models import Count

from scheduler_app.models import Job, JobState


def job_counts_by_state() -> dict[str, int]:
    """State -> number of jobs, with every state present (zero when none)."""
    counts = dict(Job.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    return {state: counts.get(state, 0) for state in JobState.values}
