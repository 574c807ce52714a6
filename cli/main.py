"""`python -m cli`: argument parsing and dispatch; the jobs' commands live in cli/commands.py, the
cluster's (nodes, workloads, acct) in cli/cluster_commands.py."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from typing import TextIO

from cli import __version__, cluster_commands, commands, job_control, job_history, show, waiting
from cli.api import Api, CliError
from cli.config import program, resolve

EPILOG = """\
The service's address comes from --server, $ATTUNE_SERVER or the last `login` (default
http://127.0.0.1:8000); the token from --token, $ATTUNE_TOKEN or the last `login`.

examples:
  python -m cli login --username alice
  python -m cli submit train.sh          # a batch script: its #SBATCH / #ATTUNE lines are the options
  python -m cli submit train-r18 --workload res18 --gpus 2 --iters 20000 --max-latency 6h
  python -m cli submit eval --command 'python eval.py' --gpus 1 --time 30 --after 41   # 30 minutes
  python -m cli submit prep --command 'python prep.py' --gpus 1 -t 1-12:00 --wait && echo done
  python -m cli submit sweep --command 'python train.py --lr-index $ATTUNE_ARRAY_TASK_ID' \\
      --gpus 1 -t 6h --array 0-7%2         # at most 2 tasks at once
  python -m cli update 42 --array-limit 4    # scontrol update ArrayTaskThrottle=4 (--time: TimeLimit=)
  python -m cli update --array 42 -t 4h     # every live task of array 42 (scontrol update JobId=42)
  python -m cli queue                    # squeue; queue -t PD,R --all
  python -m cli show 42
  python -m cli nodes                    # sinfo: free/total GPUs, cores and memory per server
  python -m cli workloads                # the catalog, with what each profile says
  python -m cli acct --window 7d --by team   # sreport: GPU-hours, jobs and waits (--csv)
  python -m cli acct --jobs --since 7d -s F,TO   # sacct: your jobs, exit codes, elapsed, nodes
  python -m cli hold 42; python -m cli release 42
  python -m cli cancel 42 43; python -m cli cancel --array 42; python -m cli cancel -n sweep -t PD
"""


def _time_limit_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    """sbatch's -t/--time (also --time-limit), as `submit` and `update` take it."""
    parser.add_argument("-t", "--time", "--time-limit", dest="time_limit", metavar="TIME", help=help_text)


def _job_ids(text: str) -> list[int]:
    """Ids separated by commas or colons, as after Slurm's afterok: "12,13" or "12:13"."""
    ids = []
    for token in text.replace(":", ",").split(","):
        token = token.strip()
        if not token.isdigit() or int(token) < 1:
            raise argparse.ArgumentTypeError(f"{token!r} is not a job id")
        ids.append(int(token))
    return ids


def _job_ref(text: str) -> int | tuple[int, int]:
    """A job id (42), or an array's task as Slurm writes it, ARRAYID_INDEX (42_3): resolved once the
    service is asked (job_control.resolve_job_refs)."""
    array, sep, index = text.strip().partition("_")
    if array.isdigit() and int(array) > 0 and (not sep or index.isdigit()):
        return (int(array), int(index)) if sep else int(array)
    raise argparse.ArgumentTypeError(f"{text!r} is not a job id: give 42, or an array's task as 42_3")


def _choices(parse: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    """An argparse type from a parser that raises ValueError (with the valid choices in its text)."""

    def convert(text: str) -> list[str]:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__  # argparse names the type in some messages
    return convert


def _dependency(text: str) -> list[int]:
    """sbatch's --dependency=afterok:ID[:ID...][,afterok:...]; the only kind Attune has."""
    ids: list[int] = []
    for part in text.split(","):
        kind, _, rest = part.partition(":")
        if kind != "afterok" or not rest:
            raise argparse.ArgumentTypeError(f"{part!r}: only afterok:ID[:ID...] is supported")
        ids += [i for i in _job_ids(rest) if i not in ids]
    return ids


SUBMIT_EPILOG = """\
A script's #SBATCH and #ATTUNE lines before its first command are read as options (the service reads
them): -J, --gpus or --gres=gpu:N, -N, -t, -a, -d afterok:IDS, -o, -e, -D, -H, --cpus-per-gpu,
--mem-per-gpu; on #ATTUNE lines also --iters, --team, --priority, --max-latency, --deadline,
--min-rate.
Options given here win over the script's (only those you give are sent). See docs/cli.md.

checkpoint contract:
  On preemption every process of the job gets SIGTERM, then SIGKILL after a grace period (30 s by
  default). Save your state to $ATTUNE_CHECKPOINT_DIR (node-local, private to the job's account) or
  to your working directory on a shared filesystem, and resume from it when the job restarts: a
  job that does not checkpoint starts over after each preemption. $ATTUNE_RESUME_ITERS is the
  progress the service last recorded; write {"done_iters": N, "iters_per_s": x} to
  $ATTUNE_PROGRESS_PATH to show progress.
  Multi-node jobs get MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE
  (torchrun's names) and SLURM_JOB_ID, SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST. Every job
  runs as its owner's Unix account in a clean environment.

examples:
  python -m cli submit train.sh
  python -m cli submit train.sh --gpus 4 -t 2:00:00      # these win over the script's directives
  python -m cli submit -J eval --command 'python eval.py' --gpus 1 -t 30m -d afterok:41
  python -m cli submit r18 --workload res18 --gpus 2 --iters 20000 --max-latency 6h

times (-t, --max-latency): 90m, 6h, 1h30m, 2d, or Slurm's MM (a bare number is minutes, as sbatch),
MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (1-12:00 is a day and a half).
"""


def _add_submit(sub: argparse._SubParsersAction) -> None:
    # Every option defaults to None (or False): submit_body sends only what was given, so a script's
    # directives are not overridden by defaults the user never typed.
    p = sub.add_parser(
        "submit",
        help="queue a job (sbatch)",
        description="Queue a batch script (as sbatch SCRIPT), your own command, or a catalog workload.",
        epilog=SUBMIT_EPILOG.replace("python -m cli", program()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "target",
        nargs="?",
        metavar="SCRIPT",
        help="a batch script to run with bash ('-': standard input); with --command or --workload, "
        "the job's name instead (as -J)",
    )
    what = p.add_argument_group("what runs (instead of a script)")
    what.add_argument("--workload", help="a catalog workload's name")
    what.add_argument(
        "--command", "--wrap", help="your own command, run with sh -c on the allocated server (sbatch --wrap)"
    )
    p.add_argument("-J", "--job-name", dest="name", metavar="NAME", help="the job's name")
    p.add_argument("-G", "--gpus", type=int, metavar="N", help="GPUs in all (on one server when they fit)")
    p.add_argument("-N", "--nodes", type=int, metavar="N", help="spread the GPUs evenly over N servers")
    p.add_argument(
        "--iters", type=int, help="total iterations of work (a workload needs it; a command may omit it)"
    )
    p.add_argument("--cpus-per-gpu", type=float, metavar="N", help="cores per GPU (default: the scheduler's)")
    mem = p.add_mutually_exclusive_group()
    mem.add_argument(
        "--mem-per-gpu", metavar="SIZE", help="memory per GPU, e.g. 16G (Slurm's units: M default)"
    )
    mem.add_argument("--mem-gb-per-gpu", type=float, metavar="GB", help="memory per GPU in GB")
    p.add_argument("--team", help="charge the job to this team (its GPU quota applies)")
    p.add_argument("--priority", type=int, help="staff only: above 0 goes first")
    _time_limit_option(p, "e.g. 90m, 6h, 30 (minutes) or Slurm's 1-12:00; the job is stopped after it")
    p.add_argument(
        "--checkpoint-every",
        metavar="TIME",
        help="how often the job checkpoints, e.g. 10m: a move or preemption loses the work since the "
        "last one (default: a catalog workload's profile; an own command: none, the whole run)",
    )
    qos = p.add_argument_group("QoS target (one of the three)")
    qos.add_argument(
        "--deadline",
        metavar="TIME",
        help="finish by this time (local time), as sbatch --deadline: 2026-11-23T18:00, 18:00 (the next), "
        "now+2hours, now+1h30m, noon, tomorrow, 12/24-18:00",
    )
    qos.add_argument(
        "--max-latency", metavar="TIME", help="finish within this long of submission, e.g. 6h or 1-12:00"
    )
    qos.add_argument(
        "--min-rate",
        metavar="ITERS_PER_S",
        help="run at least this many iterations per second while running, e.g. 2.5 (GENIE)",
    )
    p.add_argument(
        "-d",
        "--dependency",
        type=_dependency,
        dest="after",
        metavar="afterok:IDS",
        help="start only once these jobs completed: --dependency=afterok:41:42",
    )
    p.add_argument("--after", type=_job_ids, metavar="IDS", help="the same as --dependency=afterok: 41,42")
    p.add_argument(
        "-a",
        "--array",
        metavar="INDICES",
        help="one job per task index, e.g. 0-9 or 1,3,5-7 or 0-15:4 (sbatch --array), and %%N to run "
        "at most N at once (0-99%%4); each process sees ATTUNE_ARRAY_TASK_ID and SLURM_ARRAY_TASK_ID",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="stdout file: %%j job id, %%A array, %%a task, %%x name, %%u user, %%n node rank, %%N node",
    )
    p.add_argument("-e", "--error", metavar="PATH", help="stderr file (default: with stdout)")
    p.add_argument("-D", "--chdir", metavar="DIR", help="working directory (default: this one)")
    p.add_argument("-H", "--hold", action="store_true", help="submit it held: it waits for `release`")
    p.add_argument(
        "-W", "--wait", action="store_true", help="return only when the job has ended, with its exit status"
    )
    p.add_argument("--json", action="store_true", help="print the service's answer as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program(),
        description="Attune from the command line: submit jobs, watch the queue, hold, release, cancel; "
        "see the servers, the workload catalog and the usage.",
        epilog=EPILOG.replace("python -m cli", program()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--server", help="service URL (default: $ATTUNE_SERVER, the last login, or local)")
    parser.add_argument("--token", help="API token (default: $ATTUNE_TOKEN or the last login)")
    sub = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "login",
        help="save your API token: paste the one from the web page (account/token/), or give a local "
        "account's --username and password",
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument("--username", help="a local account: its password is asked for ($ATTUNE_PASSWORD)")
    who.add_argument("--token", dest="login_token", metavar="TOKEN", help="this token (else: asked for)")

    _add_submit(sub)

    p = sub.add_parser(
        "queue", help="pending and running jobs: everyone's, or yours where jobs are private (squeue)"
    )
    p.add_argument(
        "-t",
        "--state",
        action="append",
        type=_choices(commands.parse_job_states),
        metavar="STATES",
        help="only these states, e.g. COMPLETED or PD,R (squeue's codes); repeatable",
    )
    p.add_argument("--all", action="store_true", help="every state, finished jobs too")
    p.add_argument("-n", "--name", help="only jobs of this name, exactly (squeue --name)")
    p.add_argument("--team", help="only this team's jobs")
    p.add_argument("-u", "--user", help="only this user's jobs (squeue -u; staff see everyone's)")
    p.add_argument("--array", type=int, metavar="ID", help="only the tasks of this array, one line each")
    p.add_argument(
        "-r",
        "--tasks",
        action="store_true",
        help="one line per array task (squeue -r); without it, an array's pending tasks waiting for "
        "the same reason share a line, 20_[3-9%%2]",
    )
    p.add_argument(
        "-l",
        "--long",
        action="store_true",
        help="also each job's moves, preemptions and GPU-hours lost to restarts",
    )
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("show", help="one job in full (scontrol show job)")
    p.add_argument("job_id", type=_job_ref, metavar="JOB_ID")
    p.add_argument("--json", action="store_true")

    for action, text in (
        ("cancel", "cancel jobs (scancel)"),
        ("hold", "keep pending jobs out of the queue until released (scontrol hold)"),
        ("release", "put held jobs back in the queue (scontrol release)"),
    ):
        p = sub.add_parser(action, help=text)
        p.add_argument("job_ids", type=_job_ref, nargs="*", metavar="JOB_ID")
        p.add_argument("--array", type=int, metavar="ID", help="every pending or running task of this array")
        if action == "cancel":  # scancel's filters: every live job matching them (among JOB_IDs, if given)
            p.add_argument("-n", "--name", help="only jobs of this name (scancel -n)")
            p.add_argument("-u", "--user", help="only this user's jobs (scancel -u; default: your own)")
            p.add_argument(
                "-t",
                "--state",
                type=_choices(commands.parse_job_states),
                help="only jobs in these states: PENDING (PD) or RUNNING (R), comma-separated",
            )

    p = sub.add_parser(
        "update", help="change a job's time limit, or its array's limit on tasks at once (scontrol update)"
    )
    p.add_argument("job_ids", type=_job_ref, nargs="*", metavar="JOB_ID")
    p.add_argument("--array", type=int, metavar="ID", help="every pending or running task of this array")
    _time_limit_option(p, "a new time limit (as submit's; only staff may raise one)")
    p.add_argument(
        "--array-limit",
        type=int,
        metavar="N",
        help="at most N of the job's array's tasks at once, for every task (--array ...%%N; 0: no limit)",
    )

    p = sub.add_parser("log", help="the last lines of a job's output")
    p.add_argument("job_id", type=_job_ref, metavar="JOB_ID")

    p = sub.add_parser(
        "wait", help="print each job's state changes and progress until it ends: 0 if all completed"
    )
    p.add_argument("job_ids", type=_job_ref, nargs="+", metavar="JOB_ID")

    p = sub.add_parser("nodes", help="servers: state, free/total GPUs, cores, memory, reason (sinfo)")
    p.add_argument(
        "-t",
        "--state",
        action="append",
        type=_choices(cluster_commands.parse_node_states),
        metavar="STATES",
        help="only servers in these states, e.g. IDLE,MIXED or DRAINED; repeatable",
    )
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("workloads", help="the catalog's workloads and what their profiles say")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser(
        "acct", help="GPU-, core- and GB-hours, jobs by end state and waits per user or team (sreport)"
    )
    p.add_argument(
        "--window",
        choices=cluster_commands.ACCOUNTING_WINDOWS,
        help="the last hour ... 365 days, up to now (default: the service's, 30d)",
    )
    p.add_argument("--start", metavar="TIME", help="instead of --window: from this time, e.g. 2026-05-01")
    p.add_argument("--end", metavar="TIME", help="until this time (default: now); local time without offset")
    p.add_argument("--by", choices=("user", "team"), default="user", help="one row per user or per team")
    jobs = p.add_argument_group("one line per job instead (sacct)")
    jobs.add_argument(
        "--jobs",
        action="store_true",
        help="your jobs: state, exit code, elapsed, GPUs, nodes (sacct); with -s, --since, -u",
    )
    jobs.add_argument(
        "-s",
        "--state",
        action="append",
        type=_choices(commands.parse_job_states),
        metavar="STATES",
        help="with --jobs: only these states, e.g. F,TO or COMPLETED (sacct -s); repeatable",
    )
    jobs.add_argument(
        "--since", metavar="TIME", help="with --jobs: ended (or submitted) since 2026-05-01, or 7d ago"
    )
    jobs.add_argument("-u", "--user", help="with --jobs: this user's jobs instead (staff see everyone's)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--csv", action="store_true", help="the service's CSV, for a spreadsheet")
    out.add_argument("--json", action="store_true")
    for p in (sub.choices["submit"], sub.choices["wait"]):
        p.add_argument("--poll-s", type=float, default=5.0, help=argparse.SUPPRESS)
    return parser


def _run(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """The command's work: its exit status."""
    if getattr(args, "job_ids", None):
        args.job_ids = job_control.resolve_job_refs(api, args.job_ids)
    if isinstance(getattr(args, "job_id", None), tuple):
        (args.job_id,) = job_control.resolve_job_refs(api, [args.job_id])
    if args.command_name == "login":
        return commands.login(api, username=args.username, token=args.login_token or args.token, out=out)
    if args.command_name == "submit":
        return commands.submit(api, args, out)
    if args.command_name == "queue":
        return commands.queue(api, args, out)
    if args.command_name == "show":
        return show.show(api, args.job_id, as_json=args.json, out=out)
    if args.command_name == "update":
        job_ids = list(args.job_ids)
        if args.array:  # scontrol update JobId=ARRAYID: every task of the array
            job_ids += job_control.live_array_tasks(api, args.array)
        if not job_ids:
            raise CliError("give job ids, or --array ID (with pending or running tasks)", exit_code=2)
        return job_control.update(
            api, job_ids, time_limit=args.time_limit, array_limit=args.array_limit, out=out
        )
    if args.command_name == "wait":
        return waiting.wait(api, args.job_ids, poll_s=args.poll_s, out=out)
    if args.command_name == "acct" and args.jobs:
        return job_history.acct_jobs(api, args, out)
    if args.command_name == "acct" and (args.state or args.since or args.user):
        raise CliError("-s, --since and -u go with --jobs (one line per job)", exit_code=2)
    if args.command_name in ("nodes", "workloads", "acct"):
        return getattr(cluster_commands, args.command_name)(api, args, out)
    if args.command_name in ("cancel", "hold", "release"):
        job_ids = list(args.job_ids)
        if args.array:
            job_ids += job_control.live_array_tasks(api, args.array)
        # cancel's filters (scancel -n, -u, -t); an --array without live tasks is refused below.
        filters = [getattr(args, f, None) for f in ("name", "user", "state")]
        if any(filters) and (job_ids or not args.array):
            job_ids = job_control.live_jobs_matching(
                api, job_ids=job_ids, name=args.name, user=args.user, states=args.state or []
            )
            if not job_ids:
                sys.stderr.write("no pending or running job matches\n")
                return 0
        if not job_ids:
            raise CliError("give job ids, or --array ID (with pending or running tasks)", exit_code=2)
        return job_control.change(api, args.command_name, job_ids, out)
    return show.log(api, args.job_id, out)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = resolve(server=args.server, token=args.token)
    api = Api(settings.server, None if args.command_name == "login" else settings.token)
    out = sys.stdout
    try:
        code = _run(api, args, out)
        out.flush()  # a reader that went away shows here, not as a traceback at exit
        return code
    except CliError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: nothing was cancelled, the jobs go on\n")
        return 130
    except BrokenPipeError:
        # `attune queue | head -1`: the reader has what it wanted; stop quietly with a pipe's status
        # (128 + SIGPIPE), as Unix tools do, and send what is still buffered nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    finally:
        api.close()
