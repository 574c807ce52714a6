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
    # DRF's shapes: {"field": ["message"]}; a nested object's errors as an object ({"data": {"x": [..]}});
    # a list's errors by index ({"depends_on": {"2": [..]}}) or item by item ({"gpus": [{}, {"uuid":
    # [..]}]}); a body that could not be parsed as {"detail": "JSON parse error - ..."}.
    "FieldErrors": {
        "type": "object",
        "additionalProperties": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}},
                {"type": "object"},
            ]
        },
        "description": "Per field (or query parameter, or `detail` / `non_field_errors`), what is wrong "
        "with it; nested fields nest. Nothing was stored.",
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
            for code, answer in responses.items():
                # A view's own 4xx (409 "already finished") carries {"detail": ...} like the rest.
                if code.startswith("4") and "content" not in answer:
                    answer["content"] = {"application/json": {"schema": DETAIL}}
    return result


# What a string may hold, as the server reads it. Its whitespace is Python's (str.strip, which DRF's
# CharField trims with and the services test with), spelt out: ECMA's \s, which a schema's `\s` means,
# lacks \x1c-\x1f and \x85 and has \ufeff. No string may hold NUL (DRF refuses it; PostgreSQL cannot
# store it). Each pattern reads left to right without backtracking (disjoint classes), so checking a
# 256 KiB script against it stays linear.
SPACE = "\\t-\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
NUL_FREE = r"^[^\x00]*$"
GIVEN = rf"^[{SPACE}]*[^\x00{SPACE}][^\x00]*$"  # something besides whitespace
BLANK = rf"^[{SPACE}]*$"
GIVEN_OR_EMPTY = rf"^([{SPACE}]*[^\x00{SPACE}][^\x00]*)?$"
# Fields whose format the server checks itself (scheduler_app/services/jobs.py), by request schema.
_INDICES = "[0-9]+(-[0-9]+(:[0-9]+)?)?"  # parse_array_spec's item: an index, a range, a range:step
_SPACES = f"[{SPACE}]*"
FIELD_PATTERNS = {
    # Blank (no array), or items separated by commas, blank items ignored, at least one index; then
    # optionally %N, the limit on tasks running at once.
    "array": rf"^({_SPACES}|({_SPACES},)*{_SPACES}{_INDICES}{_SPACES}(,{_SPACES}({_INDICES}{_SPACES})?)*"
    rf"(%{_SPACES}[0-9]+{_SPACES})?)$",
    # sbatch's submission directory: absolute, or blank (none).
    "submit_dir": rf"^{_SPACES}(/[^\x00]*)?$",
    # sbatch's file name patterns (job_paths.output_pattern_problem): a % starts one of its codes.
    "output": r"^([^\x00%]|%[jAaxunN%])*$",
    "error": r"^([^\x00%]|%[jAaxunN%])*$",
}


def _user_operations(result: dict[str, Any]):
    """Every operation of the users' API (the agents' protocol has its own rules)."""
    for path, operations in result.get("paths", {}).items():
        if path.startswith("/api/v1/agent/"):
            continue
        for operation in operations.values():
            if isinstance(operation, dict):
                yield operation


def _string_rule(spec: dict[str, Any]) -> None:
    """A string the schema leaves open says what the server refuses: NUL always; blank where it
    needs a value (DRF's minLength 1 is "not blank" after trimming)."""
    if spec.get("type") != "string" or "enum" in spec or "format" in spec or "pattern" in spec:
        return
    spec["pattern"] = GIVEN if spec.get("minLength", 0) >= 1 else NUL_FREE


def express_string_rules(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry, after the submission's variants: the users' request strings (query
    parameters, body fields) carry the patterns the server applies."""
    schemas = result.get("components", {}).get("schemas", {})
    seen: set[str] = set()

    def visit(spec: dict[str, Any]) -> None:
        ref = spec.get("$ref", "")
        if ref:
            name = ref.rsplit("/", 1)[-1]
            if name not in seen and name in schemas:
                seen.add(name)
                visit(schemas[name])
            return
        for key in ("oneOf", "anyOf", "allOf"):
            for part in spec.get(key, []):
                visit(part)
        for name, prop in spec.get("properties", {}).items():
            if name in FIELD_PATTERNS and prop.get("type") == "string":
                prop["pattern"] = FIELD_PATTERNS[name]
            visit(prop)
        if isinstance(spec.get("items"), dict):
            visit(spec["items"])
        _string_rule(spec)

    for operation in _user_operations(result):
        for parameter in operation.get("parameters", []):
            if parameter.get("in") == "query":
                _string_rule(parameter.get("schema", {}))
        for media in operation.get("requestBody", {}).get("content", {}).values():
            visit(media.get("schema", {}))
    return result


# A submission runs exactly one of a catalog workload, an own command or a batch script
# (scheduler_app/services/jobs.py). Each is a schema of its own with every field, so that a generated
# client gets three complete request types; the request body is oneOf them. "Given" means a string with
# something besides whitespace; "not given" means absent, null, or blank.
SUBMISSION_VARIANTS = {
    "JobSubmitWorkload": {
        "what": "a catalog workload (total_iters required)",
        "required": ["name", "workload", "total_iters"],
        "given": "workload",
    },
    "JobSubmitCommand": {
        "what": "an own command, run by sh -c",
        "required": ["name", "command"],
        "given": "command",
    },
    "JobSubmitScript": {
        "what": "an own batch script, run by bash; its directives fill the fields not given (the name too)",
        "required": ["script"],
        "given": "script",
    },
}
SUBMISSION_SCHEMA = "JobSubmitRequest"


def _variant(base: dict[str, Any], required: list[str], given: str, what: str) -> dict[str, Any]:
    properties = {name: dict(spec) for name, spec in base["properties"].items()}
    for name in ("workload", "command", "script"):
        spec = properties[name]
        if name == given and name == "workload":
            spec.pop("nullable", None)
        elif name == given:
            spec["pattern"] = GIVEN
            spec.pop("default", None)
        elif name == "workload":
            properties[name] = {
                "type": "string",
                "nullable": True,
                "enum": [None],
                "description": "Not used here",
            }
        else:
            properties[name] = {"type": "string", "pattern": BLANK, "description": "Not used here: blank"}
    if given == "workload":
        properties["total_iters"].pop("nullable", None)
    # A name is needed, not blank; a script's may be left empty (its directives or file name give one).
    properties["name"].pop("minLength", None)
    properties["name"]["pattern"] = GIVEN_OR_EMPTY if "name" not in required else GIVEN
    return {
        "type": "object",
        "description": f"Submit {what}.",
        "properties": properties,
        "required": required,
    }


def express_submission_variants(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry: POST /api/v1/jobs/ takes oneOf a workload, command or script job."""
    schemas = result.get("components", {}).get("schemas", {})
    base = schemas.pop(SUBMISSION_SCHEMA, None)
    if base is None:
        return result
    for name, variant in SUBMISSION_VARIANTS.items():
        schemas[name] = _variant(base, variant["required"], variant["given"], variant["what"])
    one_of = {"oneOf": [{"$ref": f"#/components/schemas/{name}"} for name in SUBMISSION_VARIANTS]}
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            content = (
                operation.get("requestBody", {}).get("content", {}) if isinstance(operation, dict) else {}
            )
            for media in content.values():
                if media.get("schema", {}).get("$ref", "").endswith(f"/{SUBMISSION_SCHEMA}"):
                    media["schema"] = one_of
    return result
