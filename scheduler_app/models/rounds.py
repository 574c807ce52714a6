"""Scheduling rounds and the decision each made for each job."""

from django.db import models
from django.utils import timezone

from scheduler_app.models.jobs import Job


class SchedulingRound(models.Model):
    """One run of the scheduler over the cluster, with its policy, allocator and outcome counts."""

    started_at = models.DateTimeField(default=timezone.now)
    duration_ms = models.FloatField(default=0)
    policy = models.CharField(max_length=32)
    allocator = models.CharField(max_length=32)
    trigger = models.CharField(max_length=32, default="beat")
    num_runnable = models.PositiveIntegerField(default=0)
    num_placed = models.PositiveIntegerField(default=0)
    num_pending = models.PositiveIntegerField(default=0)
    num_infeasible = models.PositiveIntegerField(default=0)
    num_preempted = models.PositiveIntegerField(default=0)
    num_resized = models.PositiveIntegerField(
        default=0, help_text="Running jobs given other cores or memory in place (same GPUs, no restart)"
    )

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["started_at"])]

    def __str__(self) -> str:
        return f"round {self.id} ({self.policy}/{self.allocator})"


class RoundDecision(models.Model):
    """What a round decided for one job, with its stable reason code."""

    # No index of its own: the unique (round, job) index leads with it, and a round writes a row per
    # queued job, so a second index costs every round's insert (about 2 ms per 1,000 rows).
    round = models.ForeignKey(
        SchedulingRound, on_delete=models.CASCADE, related_name="decisions", db_index=False
    )
    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="decisions")
    position = models.PositiveIntegerField(help_text="Place in the policy's order, 0 = first")
    outcome = models.CharField(max_length=16)
    reason = models.CharField(max_length=64)
    speedup = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["round", "position"]
        constraints = [
            models.UniqueConstraint(fields=["round", "job"], name="one_decision_per_job_per_round")
        ]

    def __str__(self) -> str:
        return f"round {self.round_id} job {self.job_id}: {self.outcome} ({self.reason})"
