"""A private OpenLDAP server (Debian's slapd) for the sign-in tests: own config, port and directory.

`Slapd(tmp_path, port).start()` writes a slapd.conf (mdb database under tmp_path), starts slapd in the
foreground as a child process and waits until it answers; `add_lab()` loads the lab's people and groups.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import ldap
from ldap import modlist

from tests.faults.processes import kill_group

SLAPD = "/usr/sbin/slapd"
SCHEMA_DIR = Path("/etc/ldap/schema")
MODULE_DIR = Path("/usr/lib/ldap")
SUFFIX = "dc=lab,dc=example"
ADMIN_DN = f"cn=admin,{SUFFIX}"
ADMIN_PASSWORD = "directory-admin-pw"
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"


@dataclass(frozen=True)
class LabUser:
    uid: str
    password: str
    given_name: str
    surname: str
    uid_number: int


@dataclass(frozen=True)
class LabGroup:
    cn: str
    members: tuple[str, ...]  # uids


def slapd_missing() -> str | None:
    """Why slapd cannot run here, or None."""
    if not Path(SLAPD).exists():
        return f"{SLAPD} is absent: apt-get install -y slapd ldap-utils"
    if not (SCHEMA_DIR / "inetorgperson.schema").exists() or not (MODULE_DIR / "back_mdb.la").exists():
        return f"slapd's schemas ({SCHEMA_DIR}) or back_mdb module ({MODULE_DIR}) are absent"
    return None


class Slapd:
    """slapd on 127.0.0.1:`port` with an empty `dc=lab,dc=example` until `add_lab`."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.uri = f"ldap://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 15.0) -> Slapd:
        (self.root / "db").mkdir(parents=True, exist_ok=True)
        conf = self.root / "slapd.conf"
        schemas = "".join(
            f"include {SCHEMA_DIR / name}.schema\n" for name in ("core", "cosine", "inetorgperson", "nis")
        )
        conf.write_text(
            f"{schemas}modulepath {MODULE_DIR}\nmoduleload back_mdb\n"
            f"pidfile {self.root / 'slapd.pid'}\nargsfile {self.root / 'slapd.args'}\n"
            # Anyone may read (the service binds as a search account in real labs; here anonymously
            # too), a password only for binding as its owner.
            "access to attrs=userPassword by anonymous auth by self write by * none\n"
            "access to * by * read\n"
            f'database mdb\nmaxsize 10485760\nsuffix "{SUFFIX}"\nrootdn "{ADMIN_DN}"\n'
            f"rootpw {ADMIN_PASSWORD}\ndirectory {self.root / 'db'}\n"
        )
        log = (self.root / "slapd.log").open("wb")
        # -d 0: stay in the foreground (a child the fixture can stop), logging nothing but errors.
        self.process = subprocess.Popen(
            [SLAPD, "-f", str(conf), "-h", f"{self.uri}/", "-d", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # stopped as a group (kill_group)
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"slapd exited: {(self.root / 'slapd.log').read_text()[-2000:]}")
            try:
                self._admin().unbind_s()
                return self
            except ldap.LDAPError:  # not listening yet
                time.sleep(0.1)
        raise RuntimeError(f"slapd did not answer on {self.uri} in {timeout_s} s")

    def stop(self) -> None:
        kill_group(self.process, signal.SIGTERM)
        shutil.rmtree(self.root / "db", ignore_errors=True)

    def _admin(self) -> ldap.ldapobject.LDAPObject:
        conn = ldap.initialize(self.uri)
        conn.set_option(ldap.OPT_NETWORK_TIMEOUT, 2)
        conn.simple_bind_s(ADMIN_DN, ADMIN_PASSWORD)
        return conn

    def add_lab(self, users: list[LabUser], groups: list[LabGroup]) -> None:
        """The base, ou=people with posixAccount/inetOrgPerson users, ou=groups with groupOfNames."""

        def enc(values: dict[str, list[str] | str]) -> dict[str, list[bytes]]:
            return {k: [x.encode() for x in ([v] if isinstance(v, str) else v)] for k, v in values.items()}

        conn = self._admin()
        try:
            entries = [
                (SUFFIX, {"objectClass": ["dcObject", "organization"], "dc": "lab", "o": "Lab"}),
                (PEOPLE, {"objectClass": "organizationalUnit", "ou": "people"}),
                (GROUPS, {"objectClass": "organizationalUnit", "ou": "groups"}),
            ]
            entries += [
                (
                    f"uid={u.uid},{PEOPLE}",
                    {
                        "objectClass": ["inetOrgPerson", "posixAccount"],
                        "uid": u.uid,
                        "cn": f"{u.given_name} {u.surname}",
                        "givenName": u.given_name,
                        "sn": u.surname,
                        "mail": f"{u.uid}@lab.example",
                        "uidNumber": str(u.uid_number),
                        "gidNumber": str(u.uid_number),
                        "homeDirectory": f"/home/{u.uid}",
                        "userPassword": u.password,
                    },
                )
                for u in users
            ]
            entries += [
                (
                    f"cn={g.cn},{GROUPS}",
                    {
                        "objectClass": "groupOfNames",
                        "cn": g.cn,
                        "member": [f"uid={m},{PEOPLE}" for m in g.members],
                    },
                )
                for g in groups
            ]
            for dn, attrs in entries:
                conn.add_s(dn, modlist.addModlist(enc(attrs)))
        finally:
            conn.unbind_s()

    def set_members(self, group: str, uids: list[str]) -> None:
        """Replace a group's members (the directory's admin moving people between teams)."""
        conn = self._admin()
        try:
            members = [f"uid={m},{PEOPLE}".encode() for m in uids]
            conn.modify_s(f"cn={group},{GROUPS}", [(ldap.MOD_REPLACE, "member", members)])
        finally:
            conn.unbind_s()
