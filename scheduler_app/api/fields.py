"""Strict serializer fields for users' input: a value of the wrong JSON type is refused, not coerced.

DRF's own fields coerce: CharField takes 123 as "123", BooleanField takes "yes" (and 1, "on") as true,
IntegerField and FloatField take numeric strings, and FloatField takes "NaN" and "1e400" (infinity).
These classes take only the JSON type they name. A form-encoded body (everything a string) is parsed
as text, but still strictly: booleans only "true"/"false", numbers finite.
"""

from __future__ import annotations

import math
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.http import QueryDict
from rest_framework import serializers


def _is_form_input(field: serializers.Field) -> bool:
    """Whether the request body was form-encoded (a QueryDict), where every value is a string."""
    return isinstance(getattr(field.root, "initial_data", None), QueryDict)


class StrictCharField(serializers.CharField):
    default_error_messages = {"invalid": "Give a string, not {type}."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid", type=_json_type(data))
        # The schema's maxLength counts what was sent; DRF's counts what is left after trimming.
        if self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return super().to_internal_value(data)


class StrictUUIDField(serializers.UUIDField):
    """A UUID as a string only (DRF's also takes a JSON integer as the UUID's 128-bit value)."""

    default_error_messages = {"not_text": "Give a UUID string, not {type}."}

    def to_internal_value(self, data: Any):
        if not isinstance(data, str):
            self.fail("not_text", type=_json_type(data))
        return super().to_internal_value(data)


class StrictSlugRelatedField(serializers.SlugRelatedField):
    """An object by its name: a non-empty string, or null where allowed. DRF's takes "" as null and
    looks up 123 as "123"; the schema says neither. An unknown name is answered with the names there
    are (up to MAX_CHOICES_SHOWN), not DRF's "Object with name=... does not exist."."""

    MAX_CHOICES_SHOWN = 20
    default_error_messages = {
        "not_name": "Give a name (a non-empty string){null}, not {given}.",
        "unknown": "Unknown {what} {given}: choose one of {choices}.",
        "none_yet": "Unknown {what} {given}: there are none yet.",
    }

    def run_validation(self, data: Any = serializers.empty):
        if data is not serializers.empty and data is not None and (not isinstance(data, str) or not data):
            null = " or null" if self.allow_null else ""
            self.fail("not_name", null=null, given=_shown(data) if data != "" else "an empty string")
        return super().run_validation(data)

    def to_internal_value(self, data: Any):
        queryset = self.get_queryset()
        try:
            return queryset.get(**{self.slug_field: data})
        except ObjectDoesNotExist:
            pass
        except (TypeError, ValueError):  # e.g. a NUL character, which PostgreSQL cannot compare
            self.fail("invalid")
        ordered = queryset.order_by(self.slug_field).values_list(self.slug_field, flat=True)
        names = [str(name) for name in ordered[: self.MAX_CHOICES_SHOWN]]
        what = queryset.model._meta.verbose_name
        if not names:
            self.fail("none_yet", what=what, given=_shown(data))
        more = queryset.count() - len(names) if len(names) == self.MAX_CHOICES_SHOWN else 0
        choices = ", ".join(names) + (f" and {more} more" if more else "")
        self.fail("unknown", what=what, given=_shown(data), choices=choices)


class StrictBooleanField(serializers.BooleanField):
    default_error_messages = {"invalid": "Give true or false, not {input}."}
    _FORM_VALUES = {"true": True, "false": False, "on": True}  # "on": an HTML checkbox

    def to_internal_value(self, data: Any) -> bool:
        if isinstance(data, bool):
            return data
        if isinstance(data, str) and _is_form_input(self) and data.lower() in self._FORM_VALUES:
            return self._FORM_VALUES[data.lower()]
        self.fail("invalid", input=_shown(data))


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"not_whole": "Give a whole number, not {input}."}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool):
            self.fail("not_whole", input=_shown(data))
        if isinstance(data, float):
            if not (math.isfinite(data) and data.is_integer()):
                self.fail("not_whole", input=_shown(data))
            data = int(data)
        elif isinstance(data, str):
            if not _is_form_input(self):
                self.fail("not_whole", input=_shown(data))
        elif not isinstance(data, int):
            self.fail("not_whole", input=_shown(data))
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    default_error_messages = {
        "invalid": "Give a number, not {input}.",
        "not_finite": "Give a finite number.",
    }

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float | str):
            self.fail("invalid", input=_shown(data))
        if isinstance(data, str) and not _is_form_input(self):
            self.fail("invalid", input=_shown(data))
        try:
            value = float(data)
        except (TypeError, ValueError, OverflowError):
            self.fail("invalid", input=_shown(data))
        if not math.isfinite(value):
            self.fail("not_finite")
        return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _shown(value: Any) -> str:
    """The value as the user sent it, short: a string quoted, anything else by its JSON type."""
    if isinstance(value, str):
        return f"“{value[:40]}”" + ("…" if len(value) > 40 else "")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return "a fraction" if isinstance(value, float) and math.isfinite(value) else "that number"
    return _json_type(value)
