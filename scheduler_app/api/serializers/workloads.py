"""Serializers of the workload catalog: each workload with a short summary of its profile."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from profiles_app.models import GenieFit, Workload
from profiles_app.selectors import workload_genie_fit, workload_profile


class WorkloadProfileSerializer(serializers.Serializer):
    """What the profile says, at a glance (Synergy's sensitivity profile, GENIE's learnt corrections)."""

    iter_time_s = serializers.FloatField(
        help_text="Seconds per iteration on 1 GPU with a GPU-proportional share of cores and memory (GENIE's "
        "fitted time when the workload has a fit), as corrected by finished jobs' measured speeds"
    )
    best_cpus_per_gpu = serializers.FloatField(help_text="CPU cores per GPU at which it runs fastest")
    best_mem_gb_per_gpu = serializers.FloatField(help_text="Memory per GPU (GB) at which it runs fastest")
    speedup = serializers.FloatField(
        help_text="Its speed with the best cores and memory over that with a GPU-proportional share"
    )
    placement_penalty = serializers.FloatField(
        help_text="Spread over several servers it runs this many times slower (without a GENIE fit, "
        "which times each spread itself)"
    )
    interference_kappa = serializers.FloatField(
        help_text="GENIE's interference: a multi-GPU job runs (1 + kappa x) times slower next to x other "
        "multi-GPU jobs on its servers; 0 until measured"
    )


class GenieFitSerializer(serializers.ModelSerializer):
    """GENIE's predictor of the workload, from its latest lightweight profiling run (docs/genie.md)."""

    profiling_run = serializers.IntegerField(source="run_id", allow_null=True)
    fitted_at = serializers.DateTimeField(source="created_at")

    class Meta:
        model = GenieFit
        fields = [
            "alpha_s",
            "beta_s",
            "t_intra_s",
            "t_cross_s",
            "startup_s",
            "r2",
            "r2_compute",
            "measured",
            "filled",
            "samples",
            "residuals",
            "profiling_run",
            "fitted_at",
        ]
        read_only_fields = fields


class WorkloadSerializer(serializers.ModelSerializer):
    profile = serializers.SerializerMethodField(
        help_text="Null until the workload is profiled (its jobs then wait with reason Profiling)"
    )
    genie = serializers.SerializerMethodField(
        help_text="GENIE's predictor fit (per-iteration time = alpha_s*b + beta_s + ceil(log2 k)*t_intra_s "
        "+ log2(n)*t_cross_s); null until a GENIE profiling run has measured it"
    )

    class Meta:
        model = Workload
        fields = ["name", "workload_class", "description", "batch_size", "profile", "genie"]
        read_only_fields = fields

    @extend_schema_field(WorkloadProfileSerializer(allow_null=True))
    def get_profile(self, workload: Workload) -> dict[str, Any] | None:
        profile = workload_profile(workload)
        if profile is None:
            return None
        return WorkloadProfileSerializer(profile).data

    @extend_schema_field(GenieFitSerializer(allow_null=True))
    def get_genie(self, workload: Workload) -> dict[str, Any] | None:
        fit = workload_genie_fit(workload)
        return None if fit is None else GenieFitSerializer(fit).data
