"""The API's pagination: LimitOffsetPagination that refuses a malformed limit or offset.

DRF's own silently falls back to the defaults on "-5" or "abc", and passes an offset of 10^30 to the
database (an error there, a 500 here). Here either is a 400 naming the parameter.
"""

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

MAX_OFFSET = 10**9


class StrictLimitOffsetPagination(LimitOffsetPagination):
    max_limit = 1000  # a larger limit is served as this many (DRF's cutoff)

    def get_limit(self, request) -> int:
        if self.limit_query_param not in request.query_params:
            return self.default_limit
        limit = self._whole(request, self.limit_query_param, minimum=1, maximum=None)
        return min(limit, self.max_limit) if self.max_limit else limit

    def get_offset(self, request) -> int:
        if self.offset_query_param not in request.query_params:
            return 0
        return self._whole(request, self.offset_query_param, minimum=0, maximum=MAX_OFFSET)

    def get_schema_operation_parameters(self, view) -> list[dict]:
        parameters = super().get_schema_operation_parameters(view)
        bounds = {
            self.limit_query_param: {"minimum": 1},
            self.offset_query_param: {"minimum": 0, "maximum": MAX_OFFSET},
        }
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters

    @staticmethod
    def _whole(request, name: str, *, minimum: int, maximum: int | None) -> int:
        text = request.query_params[name]  # digits only, as the schema says: no sign, space or point
        if not (text.isascii() and text.isdigit()):
            raise ValidationError({name: [f"Give a whole number from {minimum}."]})
        digits = text.lstrip("0") or "0"
        # Any length the schema allows: a number of more than 30 digits is above every bound (and
        # int() of thousands of digits is a ValueError in Python 3.11), so a limit is served capped.
        value = int(digits) if len(digits) <= 30 else 10**30
        if value < minimum:
            raise ValidationError({name: [f"Give a whole number from {minimum}."]})
        if maximum is not None and value > maximum:
            raise ValidationError({name: [f"Give a whole number up to {maximum}."]})
        return value
