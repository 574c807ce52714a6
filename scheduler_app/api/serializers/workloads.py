"""Serializers of the workload catalog: each workload with a short summary of its profile."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from profiles_app.models import Workload
from profiles_app.selectors import workload_profile


class WorkloadProfileSerializer(serializers.Serializer):
    """What the profile says, at a glance (Synergy's sensitivity profile, GENIE's learnt corrections)."""

    iter_time_s = serializers.FloatField(
        help_text="Seconds per iteration with a GPU-proportional share of cores and memory, as "
        "corrected by finished jobs' measured speeds"
    )
    best_cpus_per_gpu = serializers.FloatField(help_text="CPU cores per GPU at which it runs fastest")
    best_mem_gb_per_gpu = serializers.FloatField(help_text="Memory per GPU (GB) at which it runs fastest")
    speedup = serializers.FloatField(
        help_text="Its speed with the best cores and memory over that with a GPU-proportional share"
    )
    placement_penalty = serializers.FloatField(
        help_text="Spread over several servers it runs this many times slower"
    )


class WorkloadSerializer(serializers.ModelSerializer):
    profile = serializers.SerializerMethodField(
        help_text="Null until the workload is profiled (its jobs then wait with reason Profiling)"
    )

    class Meta:
        model = Workload
        fields = ["name", "workload_class", "description", "batch_size", "profile"]
        read_only_fields = fields

    @extend_schema_field(WorkloadProfileSerializer(allow_null=True))
    def get_profile(self, workload: Workload) -> dict[str, Any] | None:
        profile = workload_profile(workload)
        if profile is None:
            return None
        return WorkloadProfileSerializer(profile).data
