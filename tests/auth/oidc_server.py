"""A real OpenID Connect provider process for the sign-in tests: panva's oidc-provider under Node.js.

tests/auth/oidc_provider/ holds its package.json and lock file; `npm ci --prefix tests/auth/oidc_provider`
(.ci/run does it) installs it. `OIDCProvider(...).start()` runs server.mjs with a JSON config (client,
redirect URIs, users with passwords and groups) and waits for its discovery document.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from tests.faults.processes import kill_group

PROVIDER_DIR = Path(__file__).resolve().parent / "oidc_provider"


@dataclass(frozen=True)
class ProviderUser:
    username: str
    password: str
    name: str
    email: str
    groups: list[str]


def provider_missing() -> str | None:
    """Why the provider cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is absent: apt-get install -y nodejs npm"
    if not (PROVIDER_DIR / "node_modules" / "oidc-provider").is_dir():
        return f"oidc-provider is not installed: npm ci --prefix {PROVIDER_DIR}"
    return None


class OIDCProvider:
    """The provider on http://127.0.0.1:`port`, one confidential client, `users` who may sign in."""

    def __init__(
        self,
        root: Path,
        port: int,
        *,
        client_id: str,
        client_secret: str,
        redirect_uris: list[str],
        users: list[ProviderUser],
    ) -> None:
        self.root = root
        self.issuer = f"http://127.0.0.1:{port}"
        self.client_id = client_id
        self.client_secret = client_secret
        self.config = {
            "port": port,
            "client_id": client_id,
            "client_secret": client_secret,
            "redirect_uris": redirect_uris,
            "users": [asdict(u) for u in users],
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.discovery: dict = {}

    def start(self, timeout_s: float = 30.0) -> OIDCProvider:
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "provider.json"
        config.write_text(json.dumps(self.config))
        log_path = self.root / "provider.log"
        self.process = subprocess.Popen(
            ["node", str(PROVIDER_DIR / "server.mjs"), str(config)],
            cwd=PROVIDER_DIR,
            stdout=log_path.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # stopped as a group (kill_group)
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the OIDC provider exited: {log_path.read_text()[-2000:]}")
            try:
                answer = httpx.get(f"{self.issuer}/.well-known/openid-configuration", timeout=2)
                if answer.status_code == 200:
                    self.discovery = answer.json()
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the OIDC provider did not answer on {self.issuer} in {timeout_s} s")

    def stop(self) -> None:
        kill_group(self.process, signal.SIGTERM)

    def environment(self) -> dict[str, str]:
        """Attune's ATTUNE_OIDC_* variables for this provider, read from its discovery document, as
        docs/auth.md tells an admin to."""
        d = self.discovery
        return {
            "ATTUNE_OIDC_CLIENT_ID": self.client_id,
            "ATTUNE_OIDC_CLIENT_SECRET": self.client_secret,
            "ATTUNE_OIDC_AUTHORIZATION_ENDPOINT": d["authorization_endpoint"],
            "ATTUNE_OIDC_TOKEN_ENDPOINT": d["token_endpoint"],
            "ATTUNE_OIDC_USERINFO_ENDPOINT": d["userinfo_endpoint"],
            "ATTUNE_OIDC_JWKS_ENDPOINT": d["jwks_uri"],
            "ATTUNE_OIDC_SCOPES": "openid email profile groups",
            "ATTUNE_OIDC_LABEL": "Sign in with the lab's identity provider",
        }
