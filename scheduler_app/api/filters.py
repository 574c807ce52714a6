"""django-filter filter sets of the REST API.

A malformed parameter is a 400 naming it (DjangoFilterBackend raises the form's errors), never a
database error: ids are whole numbers within 64 bits.
"""

import django_filters
from django import forms
from drf_spectacular.utils import extend_schema_field

from scheduler_app.models import Job, JobState

MAX_ID = 2**63 - 1
MAX_IDS = 1000  # ids in one ?id= list


# At most 18 digits (leading zeros aside): below 2^63, and a bound a pattern can state (2^63-1 is not).
MAX_ID_DIGITS = 18
# Whole numbers from 1 (007 is 7), at most MAX_IDS of them, no NUL, no space.
_ID = rf"0*[1-9][0-9]{{0,{MAX_ID_DIGITS - 1}}}"
ID_LIST_PATTERN = rf"^({_ID}(,{_ID}){{0,{MAX_IDS - 1}}})?$"


def _job_id(item: str, *, max_digits: int = len(str(MAX_ID))) -> int:
    """One id as the schema says: ASCII digits only (no sign, space or decimal point), from 1 to
    2^63-1, and at most `max_digits` digits besides leading zeros."""
    digits = item.lstrip("0")
    # The length first: int() of thousands of digits is a ValueError in Python 3.11.
    if item.isascii() and item.isdigit() and 1 <= len(digits) <= max_digits and int(digits) <= MAX_ID:
        return int(digits)
    shown = f"“{item[:40]}”" if item else "an empty item"
    # The item goes in as a parameter: django-filter %-formats the message, and an item with a
    # "%" in it, spliced into the text, made that a TypeError (a 500).
    raise forms.ValidationError(
        "Give job ids (whole numbers from 1, at most %(digits)s digits), comma-separated: "
        "%(item)s is not one.",
        params={"item": shown, "digits": max_digits},
    )


class IdListField(forms.Field):
    """Comma-separated job ids ("1,2,3"): each a whole number from 1; no empty items, no spaces."""

    def to_python(self, value):
        if value in (None, ""):
            return None
        items = str(value).split(",")
        if len(items) > MAX_IDS:
            raise forms.ValidationError(f"Give at most {MAX_IDS} ids.")
        return [_job_id(item, max_digits=MAX_ID_DIGITS) for item in items]


class IdField(forms.Field):
    """One job id, digits only: forms.IntegerField would also take " 5 " and "5.0"."""

    def to_python(self, value):
        # Absent is None; present but empty ("?array_job=") is not a job id, as the schema says.
        return None if value is None else _job_id(str(value))


@extend_schema_field(
    {
        "type": "string",
        "pattern": ID_LIST_PATTERN,
        "example": "12,15,16",
        "description": "Job ids, comma-separated",
    }
)
class IdInFilter(django_filters.Filter):
    field_class = IdListField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("lookup_expr", "in")
        super().__init__(*args, **kwargs)


@extend_schema_field(
    {
        "type": "integer",
        "format": "int64",
        "minimum": 1,
        "maximum": MAX_ID,
        "description": "The tasks of this array (its first task's id)",
    }
)
class IdFilter(django_filters.Filter):
    """One job id: a whole number from 1 (NumberFilter alone takes decimals and any size)."""

    field_class = IdField


class TrueFalseField(forms.Field):
    """`true` or `false`, as the schema's boolean says: forms.NullBooleanField would take `null` or
    anything else as "not given" and list every job."""

    def to_python(self, value):
        if value is None:
            return None
        if value in ("true", "false"):
            return value == "true"
        raise forms.ValidationError("Give true or false.")


@extend_schema_field({"type": "boolean"})
class TrueFalseFilter(django_filters.Filter):
    field_class = TrueFalseField


class JobFilter(django_filters.FilterSet):
    # distinct=False: the state is the job's own column, so no row can repeat; django-filter's default
    # DISTINCT made PostgreSQL sort every matching job (all columns, scripts included) on each page.
    state = django_filters.MultipleChoiceFilter(
        choices=JobState.choices, distinct=False, help_text="Repeat for several"
    )
    name = django_filters.CharFilter(field_name="name", help_text="Job name, exactly (squeue --name)")
    team = django_filters.CharFilter(field_name="team__name", help_text="Team name")
    owner = django_filters.CharFilter(field_name="owner__username", help_text="Owner's username")
    workload = django_filters.CharFilter(field_name="workload__name", help_text="Catalog workload name")
    array_job = IdFilter(help_text="The tasks of this array (its first task's id)")
    id = IdInFilter(field_name="id", help_text="These jobs only: ids, comma-separated")
    mine = TrueFalseFilter(method="filter_mine", help_text="true: only the requester's own jobs")

    class Meta:
        model = Job
        fields = ["state", "name", "team", "owner", "workload", "array_job", "id", "mine"]

    def filter_mine(self, queryset, name, value):
        return queryset.filter(owner=self.request.user) if value else queryset
