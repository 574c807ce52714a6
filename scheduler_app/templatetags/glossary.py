"""Glossary in templates: `{{ term|explain }}` gives its line, `{% term value "code" %}` shows it on hover."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from scheduler_app import glossary

register = template.Library()

# Elements a term may be shown in; the tooltip goes around it, so the page's own markup is unchanged.
WRAPPERS = frozenset({"", "code", "strong", "small"})


@register.filter
def explain(term: Any) -> str:
    """The glossary's line for `term`, or "" when it has none."""
    return glossary.explain(term) or ""


@register.simple_tag
def term(value: Any, wrapper: str = "") -> SafeString:
    """`value` (escaped), inside `<wrapper>` if given, inside `<abbr title="its line">` if it has one."""
    if wrapper not in WRAPPERS:
        raise template.TemplateSyntaxError(f"term: wrapper must be one of {sorted(WRAPPERS)}")
    inner = format_html("<{0}>{1}</{0}>", wrapper, value) if wrapper else format_html("{}", value)
    line = glossary.explain(value)
    if not line:
        return inner
    return format_html('<abbr class="term" title="{}">{}</abbr>', line, inner)
