"""The API's JSON parser: a body too large (413) or nested too deeply (400) is refused before parsing.

DRF reads a JSON body whole through Django's request.body (DATA_UPLOAD_MAX_MEMORY_SIZE, one limit
for every endpoint, an error the test client raises) and json.loads recurses once per level: a body of
100,000 "[" was a RecursionError, a 500. This parser is not a JSONParser subclass, so DRF hands it the
unread stream: the size is checked first (the Content-Length header, then what is actually read, at
most the limit plus one byte), per endpoint; then the depth, by a scan that does not recurse (strings
cut out, the brackets left counted); only then is the body parsed, by DRF's JSONParser.
"""

from __future__ import annotations

import re
from io import BytesIO
from itertools import accumulate
from typing import Any

from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import BaseParser, JSONParser

# A user's request: a job with the largest script (256 Ki characters, up to 6 bytes each escaped in
# JSON) fits with room to spare.
USER_MAX_BODY_BYTES = 2 * 1024 * 1024
# An agent's batch of reports (up to 5,000; its log reports carry up to 256 KiB of output each).
AGENT_MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_JSON_DEPTH = 64

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class RequestBodyTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body too large."
    default_code = "request_too_large"


def json_depth(body: bytes) -> int:
    """How deeply arrays and objects nest in a JSON text (0 for a scalar), without recursion."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    return max(accumulate(_STEP[b] for b in brackets), default=0)


def max_body_bytes(view: Any) -> int:
    """The view's own limit (`max_body_bytes`: the agent endpoints set theirs), else a user's."""
    limit = getattr(view, "max_body_bytes", None)
    return limit if limit is not None else USER_MAX_BODY_BYTES


class BoundedJSONParser(BaseParser):
    media_type = JSONParser.media_type
    renderer_class = JSONParser.renderer_class

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        limit = max_body_bytes(parser_context.get("view"))
        too_large = RequestBodyTooLarge(f"Request body too large: at most {limit // 1024} KiB.")
        request = parser_context.get("request")
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0) if request is not None else 0
        except ValueError:
            declared = 0
        if declared > limit:
            raise too_large
        body = stream.read(limit + 1) if stream is not None else b""
        if len(body) > limit:
            raise too_large
        if json_depth(body) > MAX_JSON_DEPTH:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels.")
        return JSONParser().parse(BytesIO(body), media_type, parser_context)
