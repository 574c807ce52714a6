"""The work: teams, jobs and their history, scheduling rounds, leases and their reports, predictions.

One module per subject; everything is importable from `scheduler_app.models`, as Django expects.
"""

from scheduler_app.models.idempotency import IdempotencyKey
from scheduler_app.models.jobs import (
    TERMINAL_JOB_STATES,
    Job,
    JobEndPending,
    JobEvent,
    JobState,
    PendingReason,
    Team,
    UnixAccount,
    qos_deadline,
)
from scheduler_app.models.leases import (
    MAX_STORED_ITERS_PER_S,
    AgentReport,
    AgentReportKind,
    AgentReportPending,
    Allocation,
    AllocationGpu,
)
from scheduler_app.models.predictions import AdmissionPrediction, JobForecast, SimulationRun, SimulationStatus
from scheduler_app.models.rounds import RoundDecision, SchedulingRound

__all__ = [
    "MAX_STORED_ITERS_PER_S",
    "TERMINAL_JOB_STATES",
    "AdmissionPrediction",
    "AgentReport",
    "AgentReportKind",
    "AgentReportPending",
    "Allocation",
    "AllocationGpu",
    "IdempotencyKey",
    "Job",
    "JobEndPending",
    "JobEvent",
    "JobForecast",
    "JobState",
    "PendingReason",
    "RoundDecision",
    "SchedulingRound",
    "SimulationRun",
    "SimulationStatus",
    "Team",
    "UnixAccount",
    "qos_deadline",
]
