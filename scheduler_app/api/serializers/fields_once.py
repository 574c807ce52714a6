"""A ModelSerializer whose fields are worked out from its model once per class, then copied."""

from __future__ import annotations

import copy
import threading
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


# Per thread: serializer class -> one instance whose fields are bound once and kept (serializer_render).
_BOUND = threading.local()


def serializer_render(cls: type[serializers.BaseSerializer], instance: Any, context: dict) -> dict:
    """What `cls(instance, context=context).data` holds, from one serializer of `cls` per thread whose
    fields were built and bound once: a serializer's fields keep nothing of what they render (the
    instance is passed to them, the context read from their root), so only the context and the
    instance change between calls. A call nested in another of the same class gets its own instance."""
    kept = getattr(_BOUND, "serializers", None)
    if kept is None:
        kept = _BOUND.serializers = {}
    serializer = kept.pop(cls, None)  # taken while it renders: a nested call builds its own
    if serializer is None:
        serializer = cls(context={})
        serializer.fields  # noqa: B018 - built and bound here, once
    serializer._context, serializer.instance = context, instance
    try:
        return serializer.to_representation(instance)
    finally:
        serializer._context, serializer.instance = {}, None  # nothing of this request kept
        kept[cls] = serializer
