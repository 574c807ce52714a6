"""Where an own command runs and writes: Unix account names and sbatch's --output/--error patterns.

Plain functions (no Django), used at submission to validate and when a lease starts to expand.
"""

from __future__ import annotations

import re

# A portable Unix account name (useradd's rules, as LDAP and sssd names are in practice).
UNIX_USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
# sbatch's filename patterns that Attune expands: job id, array job id, task index, job name, user,
# node rank within the job and node name.
OUTPUT_PATTERN_RE = re.compile(r"%(.)")
OUTPUT_PATTERN_CODES = frozenset("jAaxunN%")
DEFAULT_OUTPUT_PATTERN = "attune-%j.out"
DEFAULT_ARRAY_OUTPUT_PATTERN = "attune-%A_%a.out"
# Every part of a job on several servers runs the script: one file each, or a shared filesystem
# would interleave them (and every part's agent would ship the others' lines too).
MULTI_NODE_SUFFIX = ".%n"
MAX_PATH_CHARS = 1024


def unix_user_problem(name: str) -> str | None:
    """Why `name` cannot be an account a job runs as, or None."""
    if name == "root":
        return "Jobs never run as root."
    if not UNIX_USER_RE.fullmatch(name):
        return f"“{name}” is not a valid Unix account name."
    return None


def output_pattern_problem(pattern: str) -> str | None:
    """Why an --output/--error pattern is unusable, or None (sbatch's %j %A %a %x %u %% only)."""
    if len(pattern) > MAX_PATH_CHARS:
        return f"A path has at most {MAX_PATH_CHARS} characters."
    if "\0" in pattern:
        return "A path cannot contain a NUL character."
    unknown = sorted({c for c in OUTPUT_PATTERN_RE.findall(pattern) if c not in OUTPUT_PATTERN_CODES})
    lone = "%" in OUTPUT_PATTERN_RE.sub("", pattern)  # a % with nothing after it
    if unknown or lone:
        shown = ", ".join(f"%{c}" for c in unknown) or "a lone %"
        return (
            f"Unknown pattern {shown}: use %j (job id), %A (array id), %a (task index), %x (name), "
            "%u (user), %n (node rank), %N (node name) or %% (a percent sign)."
        )
    return None


def default_output_pattern(*, array: bool, num_nodes: int) -> str:
    """sbatch's default file name, one per node for a job on several servers (attune-%j.%n.out)."""
    pattern = DEFAULT_ARRAY_OUTPUT_PATTERN if array else DEFAULT_OUTPUT_PATTERN
    if num_nodes > 1:
        stem, dot, ext = pattern.rpartition(".")
        pattern = f"{stem}{MULTI_NODE_SUFFIX}{dot}{ext}"
    return pattern


def output_path_expand(
    pattern: str,
    *,
    job_id: int,
    array_job_id: int | None,
    array_task_id: int | None,
    name: str,
    user: str,
    node_rank: int = 0,
    node_name: str = "",
) -> str:
    """An --output/--error pattern with its %-codes replaced (sbatch's meaning; a name's '/' becomes
    '_' so that a job name cannot point the file elsewhere)."""
    values = {
        "j": str(job_id),
        "A": str(array_job_id if array_job_id is not None else job_id),
        "a": str(array_task_id) if array_task_id is not None else "",
        "x": name.replace("/", "_"),
        "u": user,
        "n": str(node_rank),
        "N": node_name.replace("/", "_"),
        "%": "%",
    }
    return OUTPUT_PATTERN_RE.sub(lambda m: values.get(m.group(1), m.group(0)), pattern)
