"""The workload catalog, read-only: what `--workload NAME` may name and what each one's profile says."""

from drf_spectacular.utils import extend_schema
from rest_framework import generics

from profiles_app.models import Workload
from scheduler_app.api.serializers.workloads import WorkloadSerializer


class WorkloadListView(generics.ListAPIView):
    serializer_class = WorkloadSerializer
    queryset = Workload.objects.order_by("name")

    @extend_schema(
        summary="The catalog's workloads, by name, each with a summary of its profile", tags=["workloads"]
    )
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)
