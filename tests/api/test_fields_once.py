"""Job serializers' fields built once per class: each instance still gets its own, as DRF builds them."""

from __future__ import annotations

from rest_framework import serializers

from scheduler_app.api.serializers.jobs import (
    AdmissionSerializer,
    JobDetailSerializer,
    JobSubmittedSerializer,
)


def test_the_fields_are_those_drf_builds_and_each_instance_gets_its_own() -> None:
    for cls in (JobSubmittedSerializer, JobDetailSerializer, AdmissionSerializer):
        built = serializers.ModelSerializer.get_fields(cls())
        one, two = cls(context={"a": 1}).fields, cls(context={"b": 2}).fields
        assert list(one) == list(built) == list(two)
        for name, field in built.items():
            assert type(one[name]) is type(field) and one[name] is not two[name]
            assert one[name].read_only == field.read_only
            assert one[name].parent is not two[name].parent
        assert one[next(iter(one))].root.context == {"a": 1}
