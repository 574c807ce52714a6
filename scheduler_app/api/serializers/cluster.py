"""Serializers of the cluster overview and of server drain/resume."""

from __future__ import annotations

from rest_framework import serializers

from scheduler_app.api.fields import StrictCharField


class ResourcesSerializer(serializers.Serializer):
    gpus = serializers.IntegerField()
    cpus = serializers.IntegerField()
    mem_gb = serializers.FloatField()


class OverviewGpuSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    uuid = serializers.CharField()
    busy = serializers.BooleanField()
    job_id = serializers.IntegerField(allow_null=True)


class OverviewServerSerializer(serializers.Serializer):
    name = serializers.CharField()
    hostname = serializers.CharField()
    state = serializers.CharField()
    state_reason = serializers.CharField()
    gpu_model = serializers.CharField()
    agent_version = serializers.CharField()
    time_scale = serializers.FloatField(
        help_text="1 on a real node; a fake node's --time-scale (0.05: 20x faster)"
    )
    last_heartbeat_at = serializers.DateTimeField(allow_null=True)
    capacity = ResourcesSerializer()
    in_use = ResourcesSerializer()
    gpus = OverviewGpuSerializer(many=True)


class OverviewTotalsSerializer(serializers.Serializer):
    servers = serializers.IntegerField()
    gpus = serializers.IntegerField()
    cpus = serializers.IntegerField()
    mem_gb = serializers.FloatField()
    gpus_in_use = serializers.IntegerField()
    cpus_in_use = serializers.IntegerField()
    mem_gb_in_use = serializers.FloatField()
    schedulable_gpus = serializers.IntegerField()


class ClusterOverviewSerializer(serializers.Serializer):
    totals = OverviewTotalsSerializer()
    servers = OverviewServerSerializer(many=True)


class ServerDrainSerializer(serializers.Serializer):
    reason = StrictCharField(max_length=255, required=False, allow_blank=True, default="")


class ServerStateSerializer(serializers.Serializer):
    name = serializers.CharField()
    state = serializers.CharField()
    state_reason = serializers.CharField()
