"""Every state change of the work; each service is keyword-only, typed and atomic."""

from scheduler_app.services.job_lifecycle import job_event_append
from scheduler_app.services.jobs import JobRequest, job_submit

__all__ = ["JobRequest", "job_event_append", "job_submit"]
