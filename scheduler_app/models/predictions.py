"""Predictions: what-if simulation runs, admission predictions next to what happened, job forecasts."""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from scheduler_app.models.jobs import Job


class SimulationStatus(models.TextChoices):
    QUEUED = "QUEUED", "queued"
    RUNNING = "RUNNING", "running"
    SUCCEEDED = "SUCCEEDED", "succeeded"
    FAILED = "FAILED", "failed"


class SimulationRun(models.Model):
    """A what-if simulation: its parameters, progress and results (one entry per policy/allocator)."""

    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    status = models.CharField(
        max_length=16, choices=SimulationStatus.choices, default=SimulationStatus.QUEUED
    )
    parameters = models.JSONField(default=dict)
    progress = models.FloatField(default=0, help_text="0..1")
    results = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(progress__gte=0) & Q(progress__lte=1), name="simulation_progress_0_1"
            ),
        ]

    def __str__(self) -> str:
        return f"simulation {self.id} ({self.status})"


class AdmissionPrediction(models.Model):
    """What Attune predicted at submission (start, finish, QoS attainable) and, later, what happened.

    Written once by services/admission.py when the job is submitted; `actual_*` and the errors are
    filled when the job ends (services/admission_judge.py), so predictions can be audited (dashboards,
    docs/genie.md).
    """

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="admission_prediction")
    created_at = models.DateTimeField(default=timezone.now)
    policy = models.CharField(max_length=32)
    allocator = models.CharField(max_length=32)
    predicted_start_at = models.DateTimeField(null=True, blank=True)
    predicted_finish_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True, help_text="The QoS target as a time")
    attainable = models.BooleanField(
        null=True, blank=True, help_text="Predicted finish by the deadline; empty without a QoS target"
    )
    detail = models.CharField(max_length=200, blank=True, help_text="Why a time could not be predicted")
    actual_start_at = models.DateTimeField(null=True, blank=True)
    actual_finish_at = models.DateTimeField(null=True, blank=True)
    met_deadline = models.BooleanField(null=True, blank=True)
    measured_iters_per_s = models.FloatField(
        null=True, blank=True, help_text="A minimum-rate job's measured rate over its leases, when it ended"
    )
    met_min_rate = models.BooleanField(
        null=True, blank=True, help_text="Completed at or above its minimum rate; empty without one"
    )

    class Meta:
        indexes = [models.Index(fields=["created_at"])]

    def __str__(self) -> str:
        return f"prediction for job {self.job_id}"

    @property
    def finish_error_s(self) -> float | None:
        """Actual minus predicted finish (positive: later than predicted)."""
        if self.actual_finish_at is None or self.predicted_finish_at is None:
            return None
        return (self.actual_finish_at - self.predicted_finish_at).total_seconds()


class JobForecast(models.Model):
    """The current estimate of a pending or running job's start and finish (services/forecasts.py).

    One row per live job, written where it changed by the refresh after scheduling rounds and at
    submission (`computed_at`: when it last changed, the time of the forecast that changed it); every
    page, the API and the command line show these times, as of the later of `computed_at` and the last
    finished refresh (ForecastConfirmation). The prediction made at submission stays in
    AdmissionPrediction, to compare with.
    """

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="forecast")
    start_at = models.DateTimeField(null=True, blank=True)
    finish_at = models.DateTimeField(null=True, blank=True)
    detail = models.CharField(max_length=255, blank=True, help_text="Why a time is unknown")
    computed_at = models.DateTimeField()
    position = models.PositiveIntegerField(
        null=True, blank=True, help_text="A pending job's place in the policy's order at the last round"
    )

    def __str__(self) -> str:
        return f"forecast for job {self.job_id}"


class ForecastConfirmation(models.Model):
    """When the stored forecast as a whole was last confirmed: the time (the forecast's `now`) of the
    last refresh that finished, a worker's cycle (its start: it answers for the queue as it was then)
    or an inline refresh. One row (pk 1), written once a refresh has stored its last estimate, in the
    same transaction; a cycle given up (a worker killed, an error) confirms nothing.

    A job's estimate holds as of the later of this and its row's `computed_at` (when the row last
    changed: a part of a cycle, or the admission forecast that answered its submission), so that the
    refresh need not rewrite 10,000 unchanged rows to say they still hold (services/forecast_as_of.py).
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    confirmed_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"forecast confirmed at {self.confirmed_at}"
