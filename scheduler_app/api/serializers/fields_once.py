"""A ModelSerializer whose fields are worked out from its model once per class, then copied."""

from __future__ import annotations

import copy
from typing import Any

from rest_framework import serializers

# Serializer class -> its unbound fields as ModelSerializer.get_fields builds them (never bound, never
# handed out: each instance gets a deep copy, as DRF gives each one its declared fields).
_TEMPLATES: dict[type, dict[str, Any]] = {}


class FieldsOnceModelSerializer(serializers.ModelSerializer):
    """ModelSerializer.get_fields maps each model field to a serializer field on every instance, which
    was most of the CPU of rendering a job (bench.submit_cost); its result depends on the class alone
    (Meta, the declared fields), so it is built once and each instance gets a deep copy."""

    def get_fields(self) -> dict[str, Any]:
        template = _TEMPLATES.get(type(self))
        if template is None:
            # Two threads may build it at once: the same fields either way, one kept.
            template = _TEMPLATES.setdefault(type(self), super().get_fields())
        return copy.deepcopy(template)
