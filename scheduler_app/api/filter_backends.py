"""The API's filter backend: django-filter's, refusing a list's query parameters that nothing reads.

django-filter ignores a parameter it has no filter for, so a misspelt one (`?nmae=x`, `?stat=RUNNING`)
listed every job as if unfiltered: a user who asked for a few jobs got all of them and could not tell.
Here a list request's parameters must each be a filter of its view, a parameter of its pagination or
DRF's `format`; anything else is a 400 naming it and the parameters the list accepts.
"""

from __future__ import annotations

from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import mixins
from rest_framework.exceptions import ValidationError
from rest_framework.settings import api_settings

# The attributes that name a DRF paginator's query parameters (limit/offset, page/page size).
PAGINATION_PARAMETERS = (
    "limit_query_param",
    "offset_query_param",
    "page_query_param",
    "page_size_query_param",
)


def _is_list(view) -> bool:
    """A viewset's list action, or a list view (ListAPIView). Detail, create and custom actions keep
    whatever parameters they are given: their queryset is filtered by the key, not by the query."""
    action = getattr(view, "action", None)
    if action is not None:
        return action == "list"
    return isinstance(view, mixins.ListModelMixin)


class StrictFilterBackend(DjangoFilterBackend):
    def filter_queryset(self, request, queryset, view):
        if request.method == "GET" and _is_list(view):
            self._refuse_unknown(request, queryset, view)
        return super().filter_queryset(request, queryset, view)

    def _refuse_unknown(self, request, queryset, view) -> None:
        known = {api_settings.URL_FORMAT_OVERRIDE}
        filterset_class = self.get_filterset_class(view, queryset)
        if filterset_class is not None:
            known |= set(filterset_class.base_filters)
        paginator = getattr(view, "paginator", None)
        for attribute in PAGINATION_PARAMETERS:
            name = getattr(paginator, attribute, None)
            if name:
                known.add(name)
        unknown = sorted(set(request.query_params) - known)
        if unknown:
            accepted = ", ".join(sorted(name for name in known if name))
            raise ValidationError(
                {name[:64]: [f"Unknown parameter: this list accepts {accepted}."] for name in unknown[:20]}
            )
