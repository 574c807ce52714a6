"""The #SBATCH and #ATTUNE directives at the top of a batch script, read as job-submission fields."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cli.durations import parse_deadline, parse_duration_s

# Framework-free on purpose: the service, the web form and tests all call it, none needs Django here.

_DIRECTIVE = re.compile(r"#(SBATCH|ATTUNE)(?:\s|$)")
_WHOLE = re.compile(r"[0-9]+")
_SIGNED = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
_MEM = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([KMGT]?)B?", re.IGNORECASE)
_GB_PER_UNIT = {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0}
_SHOWN_LINE_CHARS = 80


class DirectiveError(ValueError):
    """A directive Attune cannot take; the message names the line, as `line 4: #SBATCH ...: why`."""

    def __init__(self, line_no: int, line: str, reason: str) -> None:
        shown = line.strip()
        if len(shown) > _SHOWN_LINE_CHARS:
            shown = shown[: _SHOWN_LINE_CHARS - 3] + "..."
        super().__init__(f"line {line_no}: {shown}: {reason}")
        self.line_no = line_no
        self.reason = reason


class _Invalid(ValueError):
    """A value a converter refuses; parse_directives adds the line."""


# --- value converters: (value, option as typed) -> the API field's value ------------------------


def _whole(value: str, option: str, what: str) -> int:
    if not _WHOLE.fullmatch(value) or int(value) < 1:
        raise _Invalid(f"{option} needs a whole number of {what}")
    return int(value)


def _gpus(value: str, option: str) -> int:
    # Slurm's --gpus=[type:]N; the type is accepted and ignored: Attune places jobs on any GPU.
    return _whole(value.rpartition(":")[2], option, "GPUs")


def _gres(value: str, option: str) -> int:
    parts = value.split(":")
    if "," in value or parts[0] != "gpu" or len(parts) > 3:
        raise _Invalid(f"{option} takes gpu:N or gpu:TYPE:N (Attune allocates GPUs only)")
    if len(parts) == 1 or (len(parts) == 2 and not _WHOLE.fullmatch(parts[1])):
        return 1  # Slurm: gpu and gpu:TYPE mean one GPU
    return _whole(parts[-1], option, "GPUs")


def _nodes(value: str, option: str) -> int:
    if "-" in value or "," in value:
        raise _Invalid(f"{option}: a range of node counts is not supported, give one number")
    return _whole(value, option, "nodes")


def _iters(value: str, option: str) -> int:
    return _whole(value, option, "iterations")


def _priority(value: str, option: str) -> int:
    if not _SIGNED.fullmatch(value):
        raise _Invalid(f"{option} needs a whole number, e.g. 10 or -5")
    return int(value)


def _positive(value: str, option: str) -> float:
    if not _NUMBER.fullmatch(value) or not 0 < float(value) < math.inf:
        raise _Invalid(f"{option} needs a positive number")
    return float(value)


def _mem_gb(value: str, option: str) -> float:
    match = _MEM.fullmatch(value)
    if not match or not 0 < float(match[1]) < math.inf:
        raise _Invalid(f"{option} needs a positive size such as 16G, 4096M or 4096 (megabytes, as Slurm)")
    return float(match[1]) * _GB_PER_UNIT[(match[2] or "M").upper()]


def _duration_s(value: str, option: str) -> float:
    """Slurm's time formats, or Attune's 90s, 30m, 6h, 1h30m, 2d: cli.durations, the one parser of
    durations (the command line's and the web form's too)."""
    try:
        return parse_duration_s(value, option=option, leave_out="leave the directive out")
    except ValueError as exc:
        raise _Invalid(str(exc)) from None


def _time_limit_s(value: str, option: str) -> int:
    return max(1, round(_duration_s(value, option)))


def _dependency(value: str, option: str) -> list[int]:
    """afterok:ID[:ID...], several joined by commas (all must complete, as Slurm's comma)."""
    ids: list[int] = []
    for part in value.split(","):
        if "?" in part:
            raise _Invalid(f"{option}: '?' (any of) is not supported, only afterok:ID[:ID...]")
        kind, _, rest = part.partition(":")
        if kind != "afterok":
            raise _Invalid(f"{option}: only afterok:ID[:ID...] is supported ({kind!r} is not)")
        tokens = rest.split(":")
        if not all(_WHOLE.fullmatch(t) and int(t) >= 1 for t in tokens):
            raise _Invalid(f"{option}: afterok takes plain job ids, e.g. afterok:41:42")
        ids += [int(t) for t in tokens if int(t) not in ids]
    return ids


def _text(value: str, option: str) -> str:
    if not value.strip():
        raise _Invalid(f"{option} needs a value")
    return value


def _deadline(value: str, option: str) -> str:
    """An ISO date and time as typed (the service reads one without an offset in its time zone); sbatch's
    other forms (now+2hours, 18:00, tomorrow: cli/durations.py) as the moment they name when the script
    is read, the submission, with this process's offset (the service's time zone)."""
    try:
        datetime.fromisoformat(value)
    except ValueError:
        pass
    else:
        return value
    try:
        return parse_deadline(value).isoformat()
    except ValueError as exc:
        raise _Invalid(f"{option} takes an ISO date and time or sbatch's forms: {exc}") from None


def _true(value: str, option: str) -> bool:
    return True


# --- the directives -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Directive:
    """One supported option: the API field it sets and how its value is read."""

    long: str
    field: str
    convert: Callable[[str, str], Any]
    metavar: str = ""  # empty for a flag
    short: str = ""
    attune_only: bool = False
    help: str = ""


DIRECTIVES: tuple[Directive, ...] = (
    Directive("job-name", "name", _text, "NAME", "J", help="the job's name"),
    Directive("gpus", "num_gpus", _gpus, "N", "G", help="GPUs in all ([TYPE:]N; the type is ignored)"),
    Directive("gres", "num_gpus", _gres, "gpu:N", help="the same as --gpus: gpu:N or gpu:TYPE:N"),
    Directive("nodes", "nodes", _nodes, "N", "N", help="servers to spread the GPUs over (one number)"),
    Directive(
        "time", "time_limit_s", _time_limit_s, "TIME", "t", help="time limit: MM, HH:MM:SS, D-HH:MM:SS..."
    ),
    Directive(
        "array", "array", _text, "INDICES", "a", help="one job per index: 0-9, 1,3,5-7, 0-15:4; %N: N at once"
    ),
    Directive(
        "dependency",
        "depends_on",
        _dependency,
        "afterok:ID[:ID...]",
        "d",
        help="start once these jobs completed",
    ),
    Directive("output", "output", _text, "PATH", "o", help="stdout file (%j %a %x %u expanded)"),
    Directive("error", "error", _text, "PATH", "e", help="stderr file (%j %a %x %u expanded)"),
    Directive("chdir", "chdir", _text, "DIR", "D", help="working directory"),
    Directive("hold", "hold", _true, "", "H", help="submit held; it waits for a release"),
    Directive("cpus-per-gpu", "cpus_per_gpu", _positive, "N", help="cores per GPU (default: Attune's)"),
    Directive("mem-per-gpu", "mem_gb_per_gpu", _mem_gb, "SIZE", help="memory per GPU: 16G, 4096M, 4096"),
    Directive(
        "iters",
        "total_iters",
        _iters,
        "N",
        attune_only=True,
        help="iterations of work (else the time limit is its length)",
    ),
    Directive(
        "team", "team", _text, "NAME", attune_only=True, help="charge the job to this team (its GPU quota)"
    ),
    Directive("priority", "priority", _priority, "N", attune_only=True, help="staff only: above 0 first"),
    Directive(
        "max-latency",
        "qos_max_latency_s",
        _duration_s,
        "DURATION",
        attune_only=True,
        help="QoS target: finish within 90s, 30m, 6h, 2d...",
    ),
    Directive(
        "deadline",
        "qos_deadline_at",
        _deadline,
        "TIME",
        attune_only=True,
        help="QoS target: finish by this time",
    ),
    Directive(
        "checkpoint-every",
        "checkpoint_every_s",
        _duration_s,
        "DURATION",
        attune_only=True,
        help="how often the job checkpoints (10m, 1h...): a move loses the work since the last one",
    ),
    Directive(
        "min-rate",
        "qos_min_rate_iters_per_s",
        _positive,
        "ITERS_PER_S",
        attune_only=True,
        help="QoS target: run at least this many iterations per second",
    ),
)
_BY_LONG = {d.long: d for d in DIRECTIVES}
_BY_SHORT = {d.short: d for d in DIRECTIVES if d.short}

# Slurm options Attune does not take, with what to use instead (None: no counterpart). An error rather
# than silently ignored: a ported script should not run believing it got a partition, memory or mail.
_TEAM_HINT = "Attune has one pool of GPUs; charge a team's quota with #ATTUNE --team NAME"
_TASKS_HINT = "ask for --nodes and --gpus; start one process per GPU from the script (e.g. torchrun)"
_PLACEMENT_HINT = "Attune chooses the servers itself"
_ENV_HINT = "every job runs as its owner in a clean environment: set variables in the script"
UNSUPPORTED: dict[str, str | None] = {
    "partition": _TEAM_HINT,
    "account": _TEAM_HINT,
    "qos": "Attune's QoS is a target: #ATTUNE --deadline TIME, --max-latency DURATION or --min-rate N",
    "mem": "use --mem-per-gpu (memory follows the GPUs)",
    "mem-per-cpu": "use --mem-per-gpu (memory follows the GPUs)",
    "cpus-per-task": "use --cpus-per-gpu",
    "mincpus": "use --cpus-per-gpu",
    "ntasks": _TASKS_HINT,
    "ntasks-per-node": _TASKS_HINT,
    "ntasks-per-gpu": _TASKS_HINT,
    "gpus-per-node": "give the job's total with --gpus (and --nodes)",
    "gpus-per-task": "give the job's total with --gpus (and --nodes)",
    "gpus-per-socket": "give the job's total with --gpus (and --nodes)",
    "exclusive": "a job's GPUs are always its own; cores and memory follow them",
    "oversubscribe": "a job's GPUs are always its own",
    "constraint": _PLACEMENT_HINT,
    "nodelist": _PLACEMENT_HINT,
    "exclude": _PLACEMENT_HINT,
    "contiguous": _PLACEMENT_HINT,
    "switches": _PLACEMENT_HINT,
    "mail-type": "Attune sends no mail: `python -m cli wait ID` or the job's page",
    "mail-user": "Attune sends no mail: `python -m cli wait ID` or the job's page",
    "export": _ENV_HINT,
    "get-user-env": _ENV_HINT,
    "requeue": "a preempted job is always requeued: checkpoint and resume (see the checkpoint contract)",
    "no-requeue": "a preempted job is always requeued: checkpoint and resume (see the checkpoint contract)",
    "signal": "on preemption the job gets SIGTERM, then SIGKILL after the grace period",
    "begin": "submit with --hold and release it when it may start",
    "nice": "use #ATTUNE --priority N (staff)",
    "wait": "a command-line option: python -m cli submit --wait",
    "parsable": "a command-line option: python -m cli submit --json",
    "time-min": None,
    "input": None,
    "open-mode": None,
    "comment": None,
    "reservation": None,
    "licenses": None,
    "clusters": None,
    "workload": "a script is its own command; a catalog workload is submitted without a script",
}
# Slurm's short forms of the options above, so `-p gpu` is answered like `--partition gpu`.
_UNSUPPORTED_SHORT = {
    "p": "partition",
    "A": "account",
    "q": "qos",
    "c": "cpus-per-task",
    "n": "ntasks",
    "C": "constraint",
    "w": "nodelist",
    "x": "exclude",
    "W": "wait",
    "i": "input",
    "s": "oversubscribe",
}


def directive_help() -> str:
    """The supported directives, one a line, for the command line's and the submit form's help."""

    def rows(attune_only: bool) -> list[str]:
        chosen = [d for d in DIRECTIVES if d.attune_only == attune_only]
        spelled = [
            (f"-{d.short}, " if d.short else "    ") + f"--{d.long}" + (f" {d.metavar}" if d.metavar else "")
            for d in chosen
        ]
        width = max(map(len, spelled))
        return [f"  {s.ljust(width)}  {d.help}" for s, d in zip(spelled, chosen, strict=True)]

    return "\n".join(
        [
            "Directives: #SBATCH or #ATTUNE lines at the top of the script, before its first command",
            "(later ones are plain comments); --opt=VALUE or --opt VALUE, several on a line:",
            *rows(attune_only=False),
            "On #ATTUNE lines only (sbatch would refuse them):",
            *rows(attune_only=True),
        ]
    )


# --- reading a script -----------------------------------------------------------------------------


def _header_lines(script: str) -> list[tuple[int, str, str]]:
    """(line number, prefix, line) for each directive before the first command, as sbatch reads them:
    blank and comment lines go on, the first other line ends the header."""
    found = []
    for line_no, line in enumerate(script.lstrip("\ufeff").splitlines(), start=1):
        match = _DIRECTIVE.match(line)
        if match:
            found.append((line_no, f"#{match[1]}", line))
            continue
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
    return found


def _unknown(option: str) -> str:
    long = option.startswith("--")
    name = option[2:].partition("=")[0] if long else _UNSUPPORTED_SHORT.get(option[1], "")
    if name in UNSUPPORTED:
        hint = UNSUPPORTED[name]
        return f"--{name} is not supported" + (f": {hint}" if hint else "")
    spelled = option.partition("=")[0] if option.startswith("--") else option[:2]
    return f"{spelled} is not a directive Attune knows (see the supported list)"


def _split_option(token: str, prefix: str) -> tuple[Directive, str | None]:
    """The directive a token names and its attached value (--opt=v, -Xv), or None when detached."""
    if token.startswith("--"):
        name, eq, value = token[2:].partition("=")
        directive = _BY_LONG.get(name)
        attached = value if eq else None
    elif token.startswith("-") and len(token) > 1:
        directive = _BY_SHORT.get(token[1])
        attached = (token[3:] if token[2] == "=" else token[2:]) if len(token) > 2 else None
    else:
        raise _Invalid(f"{token!r} is not an option: directives are options such as --gpus=2")
    if directive is None:
        raise _Invalid(_unknown(token))
    if directive.attune_only and prefix == "#SBATCH":
        raise _Invalid(f"--{directive.long} is Attune's own: put it on an #ATTUNE line")
    return directive, attached


def _parse_line(text: str, prefix: str, into: dict[str, Any]) -> None:
    try:
        tokens = shlex.split(text, comments=True)  # quotes group; an unquoted # starts a comment
    except ValueError as exc:
        raise _Invalid(f"cannot split the line: {exc}") from None
    k = 0
    while k < len(tokens):
        token = tokens[k]
        directive, value = _split_option(token, prefix)
        shown = token.partition("=")[0] if token.startswith("--") else token[:2]
        k += 1
        if not directive.metavar:
            if value is not None:
                raise _Invalid(f"{shown} takes no value")
            value = ""
        elif value is None:
            if k == len(tokens):
                raise _Invalid(f"{shown} needs a value: {shown} {directive.metavar}")
            value, k = tokens[k], k + 1
        into[directive.field] = directive.convert(value, shown)


def parse_directives(script: str) -> dict[str, Any]:
    """The API fields a script's directives set (e.g. {"name": ..., "num_gpus": 2}); a later directive
    wins over an earlier one, as in sbatch. Raises DirectiveError naming the first bad line."""
    fields: dict[str, Any] = {}
    for line_no, prefix, line in _header_lines(script):
        try:
            _parse_line(line[len(prefix) :], prefix, fields)
        except _Invalid as exc:
            raise DirectiveError(line_no, line, str(exc)) from None
    return fields


def parse_time_limit_s(text: str) -> int:
    """A time limit in seconds from sbatch's --time formats (or 30m, 6h, 2d), for the submit form;
    ValueError saying what is accepted."""
    try:
        return _time_limit_s(text, "time limit")
    except _Invalid as exc:
        raise ValueError(str(exc)) from None
