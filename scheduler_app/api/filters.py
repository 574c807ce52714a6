"""django-filter filter sets of the REST API.

A malformed parameter is a 400 naming it (DjangoFilterBackend raises the form's errors), never a
database error: ids are whole numbers within 64 bits.
"""

import django_filters
from django import forms

from scheduler_app.models import Job, JobState

MAX_ID = 2**63 - 1
MAX_IDS = 1000  # ids in one ?id= list


class IdListField(forms.Field):
    """Comma-separated job ids ("1,2,3"): each a whole number from 1; no empty items."""

    def to_python(self, value):
        if value in (None, ""):
            return None
        items = [item.strip() for item in str(value).split(",")]
        if len(items) > MAX_IDS:
            raise forms.ValidationError(f"Give at most {MAX_IDS} ids.")
        ids = []
        for item in items:
            if not (item.isascii() and item.isdigit() and 1 <= int(item) <= MAX_ID):
                shown = f"“{item[:40]}”" if item else "an empty item"
                raise forms.ValidationError(
                    f"Give job ids (whole numbers from 1), comma-separated: {shown} is not one."
                )
            ids.append(int(item))
        return ids


class IdInFilter(django_filters.Filter):
    field_class = IdListField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("lookup_expr", "in")
        super().__init__(*args, **kwargs)


class IdFilter(django_filters.NumberFilter):
    """One job id: a whole number from 1 (NumberFilter alone takes decimals and any size)."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(*args, **kwargs)


class JobFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices, help_text="Repeat for several")
    team = django_filters.CharFilter(field_name="team__name", help_text="Team name")
    owner = django_filters.CharFilter(field_name="owner__username", help_text="Owner's username")
    workload = django_filters.CharFilter(field_name="workload__name", help_text="Catalog workload name")
    array_job = IdFilter(help_text="The tasks of this array (its first task's id)")
    id = IdInFilter(field_name="id", help_text="These jobs only: ids, comma-separated")

    class Meta:
        model = Job
        fields = ["state", "team", "owner", "workload", "array_job", "id"]
