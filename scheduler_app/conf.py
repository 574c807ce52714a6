"""Scheduler settings: the only place that reads settings.ATTUNE_SCHEDULER (passed into core as arguments)."""

from dataclasses import dataclass

from django.conf import settings

from scheduler_app.core.policies import POLICIES, Policy
from scheduler_app.core.policies.aging import (
    DEFAULT_AGING,
    DEFAULT_AGING_FACTOR,
    DEFAULT_AGING_FLOOR_S,
    Aging,
)
from scheduler_app.core.restarts import RestartPolicy


@dataclass(frozen=True)
class SchedulerConf:
    """Policy and allocator names (core registries), round length and the live driver's knobs."""

    policy: str
    allocator: str
    round_s: float
    early_round_delay_s: float
    round_pacing: float
    inline_rounds: bool
    progress_apply_s: float
    preempt_grace_s: int
    cancel_grace_s: int
    log_tail_lines: int
    agent_report_retention_days: int
    round_decision_retention_days: int
    reject_unattainable_qos: bool
    forecast_horizon_h: float
    forecast_time_budget_s: float
    forecast_refresh_budget_s: float
    forecast_refresh_cpu_s: float
    forecast_refresh_cpu_per_round_s: float
    forecast_refresh_min_interval_s: float
    forecast_refresh_pacing: float
    forecast_window_jobs: int
    admission_answer_wait_s: float
    admission_in_request_max_jobs: int
    admission_forecast_min_interval_s: float
    private_jobs: bool
    fairshare_half_life_h: float
    rendezvous_ports: tuple[int, int]
    idempotency_key_ttl_h: float
    redis_url: str
    restarts: RestartPolicy | None  # None: rounds re-decide every job freely (no restart costs)
    own_command_startup_s: float = 30.0  # an own command's start-up until one of its leases measured it
    aging: Aging | None = DEFAULT_AGING  # the bound on a shortest-first wait (policies/aging.py); None: off

    def policy_obj(self) -> Policy:
        """The configured policy, with the aging rule where it takes one (Policy.ages)."""
        cls = POLICIES.get(self.policy)
        return cls(aging=self.aging) if cls.ages else cls()  # type: ignore[call-arg]

    @property
    def progress_deferred(self) -> bool:
        """Whether syncs leave progress-only reports to the worker's applier (never inline: no worker)."""
        return self.progress_apply_s > 0 and not self.inline_rounds

    @property
    def max_grace_s(self) -> int:
        """The longest an agent lets a stopped lease's process run before SIGKILL."""
        return max(self.preempt_grace_s, self.cancel_grace_s)


def scheduler_conf() -> SchedulerConf:
    # Read on every call (a dict lookup) so that tests can override settings.
    raw = settings.ATTUNE_SCHEDULER
    return SchedulerConf(
        policy=raw.get("policy", "swaf"),
        allocator=raw.get("allocator", "genie"),
        round_s=float(raw.get("round_s", 60)),
        early_round_delay_s=float(raw.get("early_round_delay_s", 2.0)),
        round_pacing=float(raw.get("round_pacing", 2.0)),
        inline_rounds=bool(raw.get("inline_rounds", False)) or bool(settings.CELERY_TASK_ALWAYS_EAGER),
        progress_apply_s=float(raw.get("progress_apply_s", 2.0)),
        preempt_grace_s=int(raw.get("preempt_grace_s", 30)),
        cancel_grace_s=int(raw.get("cancel_grace_s", 10)),
        log_tail_lines=int(raw.get("log_tail_lines", 500)),
        agent_report_retention_days=int(raw.get("agent_report_retention_days", 7)),
        round_decision_retention_days=int(raw.get("round_decision_retention_days", 7)),
        reject_unattainable_qos=bool(raw.get("reject_unattainable_qos", False)),
        forecast_horizon_h=float(raw.get("forecast_horizon_h", 168)),
        forecast_time_budget_s=float(raw.get("forecast_time_budget_s", 2.0)),
        forecast_refresh_budget_s=float(raw.get("forecast_refresh_budget_s", 5.0)),
        # Each refresh task's CPU on the forecasts worker: a longer forecast goes on in the next task
        # (services/forecast_cycle.py).
        forecast_refresh_cpu_s=float(raw.get("forecast_refresh_cpu_s", 0.4)),
        # And all its tasks together at most this much CPU per round interval (`round_s`): a deep
        # queue's cycle spans several rounds (0: unbounded).
        forecast_refresh_cpu_per_round_s=float(raw.get("forecast_refresh_cpu_per_round_s", 1.0)),
        forecast_refresh_min_interval_s=float(raw.get("forecast_refresh_min_interval_s", 10.0)),
        forecast_refresh_pacing=float(raw.get("forecast_refresh_pacing", 4.0)),
        # The refresh plays the running jobs and this many pending ones forward (services/forecasts.py):
        # its cost follows this, not the queue's length.
        forecast_window_jobs=int(raw.get("forecast_window_jobs", 1000)),
        # A submission's answer waits this long at most for its admission forecast (computed by the
        # forecasts worker), and only when the last one was that quick; else it follows on the job page.
        admission_answer_wait_s=float(raw.get("admission_answer_wait_s", 0.5)),
        # With a worker, up to this many live jobs the request forecasts them itself; past it the
        # forecasts worker does, for every submission of a burst at once. 0: always the worker, since a
        # forecast's cost follows the policy, not only the queue (swaf + genie: 0.35 to 1.3 s of CPU at
        # 45 live jobs), and the answer waits `admission_answer_wait_s` for a quick one anyway.
        admission_in_request_max_jobs=int(raw.get("admission_in_request_max_jobs", 0)),
        admission_forecast_min_interval_s=float(raw.get("admission_forecast_min_interval_s", 0.25)),
        private_jobs=bool(raw.get("private_jobs", False)),
        # Slurm's PriorityDecayHalfLife default: last week's use weighs half as much as today's.
        fairshare_half_life_h=float(raw.get("fairshare_half_life_h", 168)),
        # MASTER_PORT of jobs' rendezvous (torchrun's default is 29500), first and last, inclusive.
        rendezvous_ports=(
            int(raw.get("rendezvous_port_min", 29500)),
            int(raw.get("rendezvous_port_max", 30499)),
        ),
        # A retried submission within this long gets the first answer (Stripe keeps keys 24 h).
        idempotency_key_ttl_h=float(raw.get("idempotency_key_ttl_h", 24)),
        redis_url=settings.REDIS_URL,
        restarts=RestartPolicy(
            min_run_s=float(raw.get("min_run_s", 300)),
            horizon_s=float(raw.get("move_horizon_s", 1800)),
            margin=float(raw.get("move_margin", 0.5)),
        )
        if raw.get("restart_costs", True)
        else None,
        own_command_startup_s=float(raw.get("own_command_startup_s", 30.0)),
        aging=_aging(raw),
    )


def _aging(raw: dict) -> Aging | None:
    """The aging rule from the settings: a factor of 0 turns it off, a maximum wait of 0 sets none."""
    factor = float(raw.get("aging_factor", DEFAULT_AGING_FACTOR))
    if factor <= 0:
        return None
    max_wait_h = float(raw.get("aging_max_wait_h", 0.0))
    return Aging(
        factor=factor,
        floor_s=float(raw.get("aging_floor_h", DEFAULT_AGING_FLOOR_S / 3600.0)) * 3600.0,
        max_wait_s=max_wait_h * 3600.0 if max_wait_h > 0 else None,
    )
