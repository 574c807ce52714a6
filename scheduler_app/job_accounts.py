"""Which Unix accounts users' jobs may run as: never root, the agents' catalog account or a system one.

The service's check at submission (and when staff map a user to an account); every node checks again
when it starts the job (agent/accounts.py, JobIdentity), by uid, since uids differ between nodes.
The only reader of settings.ATTUNE_JOB_ACCOUNTS.
"""

from __future__ import annotations

import pwd
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings

from scheduler_app.job_paths import unix_user_problem

# Accounts that Debian, Red Hat and common services create for themselves: a web user of that name
# (the probe's `postgres` ran jobs as the database's uid) must not get their files. Where a real person
# has one of these names, staff map them to another account (UnixAccount) or set the list.
DEFAULT_RESERVED = (
    "adm", "apache", "avahi", "backup", "bin", "chrony", "daemon", "dbus", "dnsmasq", "docker", "ftp",
    "games", "gdm", "gnats", "halt", "irc", "list", "lp", "mail", "man", "messagebus", "munge", "mysql",
    "news", "nfsnobody", "nginx", "nobody", "ntp", "operator", "polkitd", "postfix", "postgres", "proxy",
    "redis", "root", "rpc", "rpcuser", "shutdown", "slurm", "sshd", "sync", "sys", "syslog", "tcpdump",
    "tss", "uucp", "uuidd", "www-data", "_apt",
)  # fmt: skip
DEFAULT_MIN_UID = 1000


@dataclass(frozen=True)
class JobAccountsConf:
    """The agents' account for catalog workloads, the lowest uid of a user's account, reserved names."""

    agent_job_user: str
    min_uid: int
    reserved: frozenset[str]


def job_accounts_conf() -> JobAccountsConf:
    # Read on every call (a dict lookup) so that tests can override settings.
    raw = getattr(settings, "ATTUNE_JOB_ACCOUNTS", {})
    return JobAccountsConf(
        agent_job_user=str(raw.get("agent_job_user", "nobody")),
        min_uid=int(raw.get("min_uid", DEFAULT_MIN_UID)),
        reserved=frozenset(n.strip() for n in raw.get("reserved") or DEFAULT_RESERVED if n.strip()),
    )


def run_as_problem(
    name: str,
    *,
    conf: JobAccountsConf | None = None,
    getpwnam: Callable[[str], pwd.struct_passwd] | None = None,
) -> str | None:
    """Why users' jobs cannot run as `name`, or None.

    By name: root, the agents' catalog account (its jobs would read and rewrite every catalog job's
    checkpoints), a reserved system name. By uid where this host knows the account (a user database
    shared with the nodes, LDAP or sssd): below the minimum. Nodes check the uid again on their own.
    """
    problem = unix_user_problem(name)
    if problem:
        return problem
    conf = conf or job_accounts_conf()
    if name == conf.agent_job_user:
        return f"“{name}” is the account the nodes run catalog workloads as: users' jobs never run as it."
    if name in conf.reserved:
        return f"“{name}” is a system account: users' jobs never run as one."
    try:
        uid = (getpwnam or pwd.getpwnam)(name).pw_uid
    except KeyError:
        return None  # unknown here: each node resolves it in its own user database
    if uid < conf.min_uid:
        return (
            f"“{name}” is a system account (uid {uid}, below {conf.min_uid}): users' jobs never run as one."
        )
    return None
