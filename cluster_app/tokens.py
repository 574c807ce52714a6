"""Agent token digests: what credentials store and look up, never the token itself."""

import hashlib


def agent_token_digest(token: str) -> str:
    """SHA-256 hex of an agent's token: the key of its AgentCredential."""
    return hashlib.sha256(token.encode()).hexdigest()
