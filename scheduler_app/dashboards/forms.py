"""The what-if form: which policies and allocators, on which cluster, over which trace."""

from __future__ import annotations

from typing import Any

from django import forms

from scheduler_app.conf import scheduler_conf
from scheduler_app.core.allocators import ALLOCATORS
from scheduler_app.core.policies import POLICIES
from scheduler_app.dashboards.history import HistoryTrace, history_trace, live_cluster_shape
from scheduler_app.dashboards.services import TRACE_GENERATED, TRACE_HISTORY
from scheduler_app.services.simulations import (
    WORKLOADS,
    SimulationRequest,
    SimulationRequestError,
    simulation_request_validate,
)

# Bounds that keep one what-if run to minutes on a worker: jobs x (policies x allocators).
MAX_JOBS = 5000
MAX_JOB_RUNS = 40_000
DEFAULT_CLUSTER = {"servers": 16, "gpus_per_server": 8, "cpus_per_server": 24, "mem_gb_per_server": 500.0}


class WhatIfForm(forms.Form):
    """Validated by the same rules as `manage.py simulate` (simulation_request_validate)."""

    policies = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, choices=())
    allocators = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, choices=())
    trace_source = forms.ChoiceField(
        label="Trace",
        widget=forms.RadioSelect,
        initial=TRACE_GENERATED,
        choices=(
            (TRACE_GENERATED, "a generated trace (the parameters below)"),
            (TRACE_HISTORY, "the cluster's own recorded job history (completed jobs)"),
        ),
    )
    workload = forms.ChoiceField(
        choices=[(w, w) for w in WORKLOADS],
        initial="philly",
        # Without deadlines edf orders by arrival like fifo, swaf shortest first like sjf (aged jobs first),
        # and no QoS rate exists.
        help_text="philly: Synergy's mix, no job has a QoS target (edf then orders as fifo, swaf as sjf); "
        "genie: GENIE's QoS workload, every job has a deadline",
    )
    num_jobs = forms.IntegerField(
        label="Jobs",
        min_value=1,
        max_value=MAX_JOBS,
        initial=200,
        help_text="generated: how many; history: the most recent completed jobs, at most this many",
    )
    jobs_per_hour = forms.FloatField(
        label="Load (jobs per hour)", min_value=0.001, max_value=10_000, initial=9.0
    )
    split_image_pct = forms.IntegerField(label="Image %", min_value=0, max_value=100, required=False)
    split_language_pct = forms.IntegerField(label="Language %", min_value=0, max_value=100, required=False)
    split_speech_pct = forms.IntegerField(label="Speech %", min_value=0, max_value=100, required=False)
    multi_gpu = forms.BooleanField(label="Multi-GPU jobs", required=False)
    seed = forms.IntegerField(min_value=0, max_value=2**31 - 1, initial=1)
    servers = forms.IntegerField(min_value=1, max_value=1024)
    gpus_per_server = forms.IntegerField(label="GPUs per server", min_value=1, max_value=64)
    cpus_per_server = forms.IntegerField(label="CPU cores per server", min_value=1, max_value=1024)
    mem_gb_per_server = forms.FloatField(label="Memory per server (GB)", min_value=1, max_value=100_000)
    round_s = forms.FloatField(label="Round length (s)", min_value=1, max_value=86400, initial=300.0)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["policies"].choices = [(n, n) for n in POLICIES.names()]
        self.fields["allocators"].choices = [(n, n) for n in ALLOCATORS.names()]
        conf = scheduler_conf()
        self.fields["policies"].initial = [conf.policy]
        self.fields["allocators"].initial = sorted({"proportional", conf.allocator})
        # The live cluster is the natural default for "what if we ran it differently".
        for name, value in (live_cluster_shape() or DEFAULT_CLUSTER).items():
            self.fields[name].initial = value
        self.history: HistoryTrace | None = None
        self.request: SimulationRequest | None = None

    def _class_split(self, data: dict[str, Any]) -> tuple[int, int, int] | None:
        parts = [data.get(f"split_{c}_pct") for c in ("image", "language", "speech")]
        if all(p is None for p in parts):
            return None  # the workload's own mix
        if any(p is None for p in parts):
            raise forms.ValidationError("give all three class percentages, or none for the workload's mix")
        if sum(parts) <= 0:
            raise forms.ValidationError("the class percentages must not all be zero")
        return (parts[0], parts[1], parts[2])

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        runs = len(data["policies"]) * len(data["allocators"])
        if runs * data["num_jobs"] > MAX_JOB_RUNS:
            raise forms.ValidationError(
                f"{runs} policy/allocator pairs x {data['num_jobs']} jobs is too much for one run "
                f"(at most {MAX_JOB_RUNS:,} job-runs): choose fewer pairs or jobs"
            )
        try:
            split = self._class_split(data)
        except forms.ValidationError as exc:
            self.add_error("split_image_pct", exc)
            return data
        request = SimulationRequest(
            servers=data["servers"],
            gpus_per_server=data["gpus_per_server"],
            cpus_per_server=data["cpus_per_server"],
            mem_gb_per_server=data["mem_gb_per_server"],
            policies=tuple(data["policies"]),
            allocators=tuple(data["allocators"]),
            round_s=data["round_s"],
            workload=data["workload"],
            num_jobs=data["num_jobs"],
            jobs_per_hour=data["jobs_per_hour"],
            class_split=split,
            multi_gpu=data["multi_gpu"],
            seed=data["seed"],
        )
        try:
            simulation_request_validate(request)
        except SimulationRequestError as exc:
            raise forms.ValidationError(str(exc)) from exc
        if data["trace_source"] == TRACE_HISTORY:
            self.history = history_trace(max_jobs=data["num_jobs"])
            if not self.history.jobs:
                self.add_error(
                    "trace_source",
                    "no completed catalog job is recorded yet"
                    + (f" ({self.history.skipped} ran their own command)" if self.history.skipped else ""),
                )
                return data
        self.request = request
        return data
