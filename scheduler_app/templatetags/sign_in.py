"""The login page's sign-in choices: `{% sign_in_choices %}` adds the lab's account hints and SSO button."""

from __future__ import annotations

from typing import Any

from django import template
from django.conf import settings

register = template.Library()


@register.inclusion_tag("registration/_sign_in_choices.html", takes_context=True)
def sign_in_choices(context: template.Context) -> dict[str, Any]:
    """What is configured (config/auth_settings.py): LDAP behind the form, an OpenID Connect button."""
    request = context.get("request")
    oidc = getattr(settings, "ATTUNE_OIDC_ENABLED", False)
    return {
        "ldap": getattr(settings, "ATTUNE_LDAP_ENABLED", False),
        "oidc": oidc,
        "oidc_label": settings.ATTUNE_OIDC["label"] if oidc else "",
        "next": context.get("next") or "",
        "sso_failed": request is not None and request.GET.get("sso") == "failed",
    }
