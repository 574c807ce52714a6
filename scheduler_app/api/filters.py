"""django-filter filter sets of the REST API."""

import django_filters

from scheduler_app.models import Job, JobState


class JobFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices, help_text="Repeat for several")
    team = django_filters.CharFilter(field_name="team__name", help_text="Team name")
    owner = django_filters.CharFilter(field_name="owner__username", help_text="Owner's username")
    workload = django_filters.CharFilter(field_name="workload__name", help_text="Catalog workload name")
    array_job = django_filters.NumberFilter(help_text="The tasks of this array (its first task's id)")
    id = django_filters.BaseInFilter(field_name="id", help_text="These jobs only: ids, comma-separated")

    class Meta:
        model = Job
        fields = ["state", "team", "owner", "workload", "array_job", "id"]
