"""Job serializers' fields built once per class: each instance still gets its own, as DRF builds them."""

from __future__ import annotations

import pytest
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


@pytest.mark.django_db
def test_copied_fields_render_as_drfs_own_and_leave_the_template_unbound(user, monkeypatch) -> None:
    """A job with leases, events and restarts renders the same from the copies as from the fields DRF
    builds for each instance; the class's template is never bound to an instance."""
    import json
    from types import SimpleNamespace

    from rest_framework.renderers import JSONRenderer

    from scheduler_app.api.serializers import fields_once
    from scheduler_app.selectors import job_detail_queryset
    from tests.scheduler_app.test_restarts_selectors import moved_twice_and_preempted

    job = job_detail_queryset(user=user).prefetch_related("depends_on").get(pk=moved_twice_and_preempted().pk)
    context = {"request": SimpleNamespace(user=user), "queue": dict, "array_job_ids": None}

    def rendered() -> dict:
        return json.loads(JSONRenderer().render(JobSubmittedSerializer(job, context=context).data))

    copied = [rendered(), rendered()]
    for template in fields_once._TEMPLATES.values():
        assert all(field.parent is None and field.field_name is None for field in template.values())
    monkeypatch.setattr(
        fields_once.FieldsOnceModelSerializer, "get_fields", serializers.ModelSerializer.get_fields
    )
    assert copied[0] == copied[1] == rendered()
    assert copied[0]["allocations"] and copied[0]["events"] and copied[0]["restarts"]["restarts"] == 3


@pytest.mark.django_db
def test_a_kept_serializer_renders_each_call_as_a_new_one_would(user) -> None:
    """serializer_render keeps one bound serializer per class and thread: each call's instance and
    context are its own (another user sees the job's details hidden), nothing is kept after it, and
    a thread of its own gets its own serializer."""
    import json
    import threading
    from types import SimpleNamespace

    from django.contrib.auth import get_user_model
    from rest_framework.renderers import JSONRenderer

    from scheduler_app.api.serializers import fields_once
    from scheduler_app.api.serializers.fields_once import serializer_render
    from scheduler_app.selectors import job_detail_queryset
    from tests.api.helpers import submit
    from tests.scheduler_app.test_restarts_selectors import moved_twice_and_preempted

    other = get_user_model().objects.create_user("other")
    jobs = [moved_twice_and_preempted(), submit(user, name="plain", command="python x.py")]
    read = job_detail_queryset(user=user).prefetch_related("depends_on")

    def context(who) -> dict:
        return {"request": SimpleNamespace(user=who), "queue": dict, "array_job_ids": [1, 2]}

    def both(job, who) -> tuple[dict, dict]:
        kept = json.loads(JSONRenderer().render(serializer_render(JobSubmittedSerializer, job, context(who))))
        new = json.loads(JSONRenderer().render(JobSubmittedSerializer(job, context=context(who)).data))
        return kept, new

    answers = []
    for job in (read.get(pk=jobs[0].pk), read.get(pk=jobs[1].pk)):
        for who in (user, other, user):
            kept, new = both(job, who)
            assert kept == new
            answers.append(kept)
    assert answers[0]["restarts"]["restarts"] == 3 and answers[3]["command"] == "python x.py"
    assert answers[4]["details_hidden"] and answers[4]["command"] == "" and not answers[5]["details_hidden"]
    kept = fields_once._BOUND.serializers[JobSubmittedSerializer]
    assert kept.instance is None and kept._context == {}
    job = read.get(pk=jobs[1].pk)
    seen = []

    def in_a_thread() -> None:
        seen.append(serializer_render(JobSubmittedSerializer, job, context(user)))
        seen.append(fields_once._BOUND.serializers[JobSubmittedSerializer])

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert json.loads(JSONRenderer().render(seen[0])) == both(job, user)[1]
    assert seen[1] is not kept  # a thread of its own, a serializer of its own
