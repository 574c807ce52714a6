"""Who a job runs as: Unix account resolution, the agent's run mode, a job's clean environment, job files."""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_JOB_USER = "nobody"
# Own jobs never run as a system account (postgres, www-data, daemon...): below this uid an account
# belongs to the system, as login.defs' UID_MIN and Slurm's defaults say. --min-uid changes it.
DEFAULT_MIN_UID = 1000
DEFAULT_JOB_PATH = "/usr/local/bin:/usr/bin:/bin"
JOB_LANG = "C.UTF-8"
# Directories on the way to a job's files: traversable by the job's account, listable by no one else.
TRAVERSE_ONLY_MODE = 0o711
PRIVATE_DIR_MODE = 0o700


class AccountError(ValueError):
    """A job that cannot run as the account it asks for (missing on this node, root, or not ours)."""


@dataclass(frozen=True, slots=True)
class Account:
    """A Unix account as the job gets it: uid, primary gid, supplementary groups (initgroups), home, shell."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Account:
        return cls(
            name=str(data["name"]),
            uid=int(data["uid"]),
            gid=int(data["gid"]),
            groups=tuple(int(g) for g in data["groups"]),
            home=str(data["home"]),
            shell=str(data["shell"]),
        )


def _from_passwd(pw: pwd.struct_passwd) -> Account:
    # getgrouplist is what initgroups(3) uses: it asks NSS, so LDAP/sssd groups come along unchanged.
    groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
    return Account(pw.pw_name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir, pw.pw_shell)


def lookup_account(name: str, *, node: str) -> Account:
    """The account `name` on this node; AccountError when it does not exist here or is root (uid 0)."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise AccountError(f"no Unix account {name!r} on node {node}") from None
    if pw.pw_uid == 0:
        raise AccountError(f"jobs never run as root, and account {name!r} on node {node} has uid 0")
    return _from_passwd(pw)


def own_account(euid: int | None = None) -> Account:
    """The agent's own account (also when its uid has no passwd entry, as in some containers)."""
    euid = os.geteuid() if euid is None else euid
    try:
        return _from_passwd(pwd.getpwuid(euid))
    except KeyError:
        home = os.environ.get("HOME", "/")
        return Account(str(euid), euid, os.getegid(), tuple(os.getgroups()), home, "/bin/sh")


@dataclass
class JobIdentity:
    """Which account a start command runs as.

    Root mode (the agent runs as root): a job runs as its `run_as` account; a catalog workload (run_as
    null) as `job_user`. Single-user mode (any other account): only jobs whose run_as is the agent's own
    account, and catalog workloads, run, as the agent's account. `job_user=None` keeps catalog workloads
    on the agent's own identity even as root: for tests whose interpreter only root can read.
    """

    job_user: str | None = DEFAULT_JOB_USER
    node: str = field(default_factory=socket.gethostname)
    euid: int = field(default_factory=os.geteuid)
    # Root mode: a job's own account (run_as) must have at least this uid, on this node (uids differ
    # per node, so the service's check at submission cannot be the last word).
    min_uid: int = DEFAULT_MIN_UID

    @property
    def is_root(self) -> bool:
        return self.euid == 0

    def check(self) -> None:
        """At start-up: AccountError when the catalog account is unusable (missing, or root)."""
        if self.is_root and self.job_user is not None:
            lookup_account(self.job_user, node=self.node)

    def account_for(self, run_as: str | None) -> Account:
        """The account a job asking for `run_as` runs as; AccountError (with the reason) when it cannot."""
        if self.is_root:
            if run_as:
                return self._owner_account(run_as)
            if self.job_user is None:
                return own_account(self.euid)
            return lookup_account(self.job_user, node=self.node)
        own = own_account(self.euid)
        if run_as and run_as != own.name:
            # Without root there is no way to become another account: refuse plainly instead of failing
            # later in the shim with a bare EPERM.
            raise AccountError(
                f"this agent runs as {own.name!r}, not root: it can run only {own.name}'s jobs"
            )
        return own

    def _owner_account(self, run_as: str) -> Account:
        """Root mode: a user's job account, refused when it is the catalog workloads' account (its
        jobs would read and rewrite every catalog job's checkpoints) or a system account (a web user
        named `postgres` would get the database's files)."""
        if self.job_user is not None and run_as == self.job_user:
            raise AccountError(
                f"account {run_as!r} is this node's account for catalog workloads (--job-user): "
                "users' jobs never run as it"
            )
        account = lookup_account(run_as, node=self.node)
        if account.uid < self.min_uid:
            raise AccountError(
                f"account {run_as!r} on node {self.node} has uid {account.uid}, a system account "
                f"(below --min-uid {self.min_uid}): users' jobs never run as one"
            )
        if self.job_user is not None:
            with contextlib.suppress(KeyError):
                if pwd.getpwnam(self.job_user).pw_uid == account.uid:  # the same uid under another name
                    raise AccountError(
                        f"account {run_as!r} has the uid of this node's account for catalog workloads "
                        f"({self.job_user}, --job-user): users' jobs never run as it"
                    )
        return account

    def describe(self) -> str:
        """The one start-up line that says which mode the agent is in."""
        if not self.is_root:
            name = own_account(self.euid).name
            return f"single-user mode: not root, so jobs run as {name!r} (other accounts' jobs are refused)"
        catalog = self.job_user if self.job_user is not None else "the agent's own account (job_user unset)"
        return (
            f"root mode: jobs run as their owners' accounts (uid {self.min_uid} or more, never {catalog}), "
            f"catalog workloads as {catalog}"
        )


def clean_env(account: Account, *, path: str = DEFAULT_JOB_PATH) -> dict[str, str]:
    """The base of a job's environment: what login(1) would set, and nothing of the agent's environment
    (which holds the agent token and the agent's own settings)."""
    return {
        "HOME": account.home,
        "USER": account.name,
        "LOGNAME": account.name,
        "SHELL": account.shell or "/bin/sh",
        "PATH": path,
        "LANG": JOB_LANG,
    }


def give_to(path: Path, account: Account, mode: int) -> None:
    """Make `path` the account's own with `mode` (chown only as root: otherwise it is ours already)."""
    if os.geteuid() == 0:
        # follow_symlinks=False: never chown what a link planted in the path points to.
        os.chown(path, account.uid, account.gid, follow_symlinks=False)
    os.chmod(path, mode)


def make_private_dir(path: Path, account: Account) -> None:
    """Create `path` owned by the account with mode 0700, in a parent set to 0711: the account can reach
    it, and no one can list what lies beside it (other jobs' directories)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, TRAVERSE_ONLY_MODE)
    path.mkdir(exist_ok=True)
    give_to(path, account, PRIVATE_DIR_MODE)


def traversable_by_others(path: Path) -> bool:
    """Whether every directory above `path` lets any account through (the search bit for others)."""
    return all(os.stat(parent).st_mode & stat.S_IXOTH for parent in path.parents)


def open_job_file(path: Path, owner_uid: int | None) -> int:
    """Open a file a job controls, for reading by the agent, which may be root. Returns an fd.

    The job can replace its files with anything: a symlink to /etc/shadow (the agent would ship it as
    log lines), a FIFO (the open would block the supervisor). So: no symlink as last component, no
    blocking, a regular file only, and owned by the job's account (a hard link to someone else's file
    is not). OSError otherwise.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if owner_uid is not None and info.st_uid != owner_uid:
            raise OSError(f"{path} is owned by uid {info.st_uid}, not the job's uid {owner_uid}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_job_file(path: Path, owner_uid: int | None, *, offset: int = 0, max_bytes: int = -1) -> bytes:
    """Bytes of a job's file from `offset` (negative: from the end), checked as `open_job_file` does."""
    with os.fdopen(open_job_file(path, owner_uid), "rb") as fh:
        if offset < 0:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() + offset))
        else:
            fh.seek(offset)
        return fh.read(max_bytes)


def job_file_size(path: Path, owner_uid: int | None) -> int | None:
    """The size of a job's file, None when it is missing or not one the agent may read."""
    with contextlib.suppress(OSError):
        fd = open_job_file(path, owner_uid)
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)
    return None
