"""OpenAPI post-processing: every operation documents the errors it can answer, with their bodies.

drf-spectacular documents what a view declares; the answers every view shares (400 with per-field
messages, 401 with its challenge, 403, 404 for a path naming an object, 413 for a body over the limit)
are added here once, so that a generated client knows them all. Declared answers are kept.
"""

from __future__ import annotations

from typing import Any

DETAIL = {"$ref": "#/components/schemas/ErrorDetail"}
FIELD_ERRORS = {"$ref": "#/components/schemas/FieldErrors"}
SCHEMAS = {
    "ErrorDetail": {
        "type": "object",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
        "description": "What went wrong, in one sentence.",
    },
    "FieldErrors": {
        "type": "object",
        "additionalProperties": {"type": "array", "items": {"type": "string"}},
        "description": "Per field (or query parameter, or `detail` / `non_field_errors`), what is wrong "
        "with it; nothing was stored.",
    },
}
# Agents answer to a Bearer challenge, users to a Token one (config/settings.py, cluster_app/authentication).
CHALLENGES = {"agentToken": "Bearer", "tokenAuth": "Token"}


def _answer(description: str, schema: dict[str, Any], challenge: str | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if challenge:
        answer["headers"] = {"WWW-Authenticate": {"schema": {"type": "string", "example": challenge}}}
    return answer


def _challenge(operation: dict[str, Any]) -> str | None:
    for requirement in operation.get("security") or []:
        for scheme in requirement:
            if scheme in CHALLENGES:
                return CHALLENGES[scheme]
    return None


def add_error_responses(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry: the shared error answers of every operation."""
    result.setdefault("components", {}).setdefault("schemas", {}).update(SCHEMAS)
    for path, operations in result.get("paths", {}).items():
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            has_body = "requestBody" in operation
            has_query = any(p.get("in") == "query" for p in operation.get("parameters", []))
            challenge = _challenge(operation)
            extra: dict[str, dict[str, Any]] = {}
            if has_body or has_query:
                extra["400"] = _answer("Bad input: per-field messages; nothing was stored", FIELD_ERRORS)
            if challenge:
                extra["401"] = _answer(f"No {challenge} credential, or a wrong one", DETAIL, challenge)
                extra["403"] = _answer("Authenticated, but not allowed to do this", DETAIL)
            if "{" in path:
                extra["404"] = _answer("No such object (or not one you can see)", DETAIL)
            if has_body:
                extra["413"] = _answer("The request body is over the size limit", DETAIL)
            for code, answer in extra.items():
                responses.setdefault(code, answer)
    return result
