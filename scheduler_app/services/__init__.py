"""Every state change of the work; each service is keyword-only, typed and atomic."""

from scheduler_app.services.jobs import JobRequest, job_event_append, job_submit

__all__ = ["JobRequest", "job_event_append", "job_submit"]
