"""DRF authentication for node agents: `Authorization: Bearer <token>`, request.auth = the agent's Server."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission

from cluster_app.models import Server
from cluster_app.selectors import agent_credential_find
from cluster_app.services import agent_credential_touch

KEYWORD = b"bearer"


class AgentPrincipal:
    """The request.user of an agent call: authenticated, but no Django user and no staff rights."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None
    id = None

    def __init__(self, server: Server) -> None:
        self.server = server
        self.username = f"agent:{server.name}"

    def __str__(self) -> str:
        return self.username


class AgentTokenAuthentication(BaseAuthentication):
    """Looks the bearer token up by its SHA-256 digest among credentials that are not revoked."""

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != KEYWORD:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Invalid Authorization header: expected 'Bearer <token>'.")
        try:
            token = parts[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        credential = agent_credential_find(token=token)
        if credential is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked agent token.")
        agent_credential_touch(credential=credential)
        return AgentPrincipal(credential.server), credential.server

    def authenticate_header(self, request) -> str:
        # Returning a challenge makes DRF answer 401 (not 403) to a missing or bad token.
        return 'Bearer realm="attune-agent"'


class IsAgent(BasePermission):
    """Only a request authenticated by an agent credential (request.auth is its Server)."""

    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, Server)


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = "cluster_app.authentication.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "The server's agent token (node_token)."}
