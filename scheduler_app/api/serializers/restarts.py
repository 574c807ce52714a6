"""A job's restarts as the API shows them (selectors/restarts.py)."""

from __future__ import annotations

from rest_framework import serializers


class JobRestartsSerializer(serializers.Serializer):
    """Read from a JobRestarts."""

    moves = serializers.IntegerField(help_text="Times a round stopped it to start it at once elsewhere")
    preemptions = serializers.IntegerField(help_text="Times a round stopped it and left it waiting")
    requeues = serializers.IntegerField(
        help_text="Times it went back to the queue by no fault of its own: a server lost, its agent shut down"
    )
    resizes = serializers.IntegerField(
        help_text="Changes of its cores or memory made in place, without a restart"
    )
    restarts = serializers.IntegerField(help_text="moves + preemptions + requeues")
    gpu_s_lost = serializers.FloatField(
        help_text="GPU-seconds lost to restarts: each restart's start-up and the work it had to do again, "
        "times the lease's GPUs (docs/rest-api.md)"
    )
