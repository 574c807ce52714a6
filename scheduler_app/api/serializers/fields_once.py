"""A ModelSerializer whose fields are worked out from its model once per class, then copied."""

from __future__ import annotations

import copy
from typing import Any

from rest_framework import relations, serializers

# Serializer class -> its unbound fields as ModelSerializer.get_fields builds them (never bound, never
# handed out: each instance gets copies, as DRF gives each one its declared fields).
_TEMPLATES: dict[type, dict[str, Any]] = {}
# Fields that hold other fields, bound to them when built (a nested serializer, a list's child): each
# instance gets them built again (deepcopy), as DRF does, so that nothing bound is shared.
_COMPOSITE = (
    serializers.BaseSerializer,
    relations.ManyRelatedField,
    serializers.ListField,
    serializers.DictField,
)


def _copy(field: Any) -> Any:
    """A field for one instance: a plain field's attributes copied (binding it sets only its own:
    name, parent, label, source), which is most of the CPU of DRF's deepcopy saved, since that builds
    each field again from its arguments; a composite one built again."""
    return copy.deepcopy(field) if isinstance(field, _COMPOSITE) else copy.copy(field)


class FieldsOnceModelSerializer(serializers.ModelSerializer):
    """ModelSerializer.get_fields maps each model field to a serializer field on every instance, which
    was most of the CPU of rendering a job (bench.submit_cost); its result depends on the class alone
    (Meta, the declared fields), so it is built once, and each instance gets copies of it (_copy)."""

    def get_fields(self) -> dict[str, Any]:
        template = _TEMPLATES.get(type(self))
        if template is None:
            # Two threads may build it at once: the same fields either way, one kept.
            template = _TEMPLATES.setdefault(type(self), super().get_fields())
        return {name: _copy(field) for name, field in template.items()}
