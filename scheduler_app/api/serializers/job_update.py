"""What a job's update (PATCH /api/v1/jobs/{id}/, Slurm's scontrol update) may change: a field left out
stays as it is (an empty body changes nothing)."""

from __future__ import annotations

from rest_framework import serializers

from scheduler_app.api.fields import StrictIntegerField
from scheduler_app.services.job_requests import MAX_ARRAY_TASKS, MAX_DURATION_S


class JobUpdateSerializer(serializers.Serializer):
    time_limit_s = StrictIntegerField(
        required=False,
        min_value=1,
        max_value=MAX_DURATION_S,
        help_text="A new time limit (TimeLimit=): its owner may lower it, staff may also raise it",
    )
    array_task_limit = StrictIntegerField(
        required=False,
        min_value=0,
        max_value=MAX_ARRAY_TASKS,
        help_text="For a task of an array: how many of the array's tasks may run at once "
        "(ArrayTaskThrottle=), for every task; 0 removes the limit",
    )
