"""Synthetic training job: runs at the speed its model's profile gives its CPU and memory allocation.

`python -m agent.workload --model res18 --iters 20000`. Standard library only (it must start fast and
never import Django). Per-iteration time = iter_time_s / tput(cpus_per_gpu, mem_gb_per_gpu) x
ATTUNE_TIME_SCALE, with tput looked up at the largest grid points <= the allocation (the smallest grid
point below the grid), as profiles_app/catalog.py and scheduler_app/core/throughput.py define it.

A profile with a "genie" entry {"alpha_s", "beta_s", "t_intra_s", "t_cross_s", "batch", "noise",
"startup_s", "param_bytes"} follows GENIE's timing model instead of iter_time_s (PAPERS 2.3): at per-GPU
batch b (`--batch`, default the entry's "batch") on k GPUs (CUDA_VISIBLE_DEVICES) of each of n servers
(NNODES), iter_time_s = alpha_s*b + beta_s + ceil(log2 k)*t_intra_s + log2(n)*t_cross_s, times a
multiplicative noise drawn once per launch, uniform in [1 - noise, 1 + noise] (default 0.01), so that a
profiling run can be checked against known coefficients. It then waits startup_s before its first
iteration, and reports param_bytes (the model's size, for the platform model) in its progress file.

Environment (set by the agent's launcher):
  ATTUNE_PROFILE_JSON     {"iter_time_s", "cpu_per_gpu_grid", "mem_gb_per_gpu_grid", "tput"}; when
                          absent, the model's 1-GPU entry in the catalog file is used
  CUDA_VISIBLE_DEVICES    comma list of GPU UUIDs: the GPU count
  ATTUNE_RESOURCES_FILE   what the lease holds now, JSON {"cpus", "core_ids", "mem_gb", "changed_at"}
                          (agent/lease_resources.py): its cores and memory win over the two below. The
                          agent rewrites it when it resizes the running lease (and sends SIGWINCH, which
                          this workload catches); the workload then runs at its profile's speed for
                          the new size from that moment on, in the same process
  ATTUNE_CPUS_GRANTED     cores granted (fake-host mode only); else the process's own CPU affinity
  ATTUNE_MEM_GB           memory granted; else RLIMIT_AS; else the machine's memory
  ATTUNE_TIME_SCALE       wall seconds per simulated second (default 1)
  NNODES                  servers the job spans (the rendezvous; default 1): GENIE's n
  ATTUNE_WARMUP_ITERS     iterations before the measured ones (the speed is exact: only reported)
  ATTUNE_RESUME_ITERS, ATTUNE_CHECKPOINT_PATH, ATTUNE_PROGRESS_PATH
Iterations are derived from elapsed time (not counted sleep by sleep), so the speed is exact even when
an iteration is shorter than a scheduler tick. Exit codes: 0 done or checkpointed after SIGTERM,
137 on MemoryError (the OOM convention the agent recognises), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import signal
import sys
import time
from bisect import bisect_right
from pathlib import Path
from typing import Any

CATALOG_PATH = (
    Path(__file__).resolve().parent.parent / "profiles_app" / "data" / "synergy_model_profiles.json"
)
DEFAULT_PROFILE_SET = "models"
OOM_EXIT_CODE = 137  # agent.exit_status.OOM_EXIT_CODE (not imported: this module stays dependency-free)
BYTES_PER_GB = 1024**3
EPS = 1e-9
TICK_S = 0.05  # wake-up period: bounds SIGTERM latency without busy-waiting on tiny iterations


class WorkloadError(Exception):
    """Bad arguments or an unusable profile."""


def load_profile(
    model: str,
    *,
    profile_set: str = DEFAULT_PROFILE_SET,
    catalog_path: Path = CATALOG_PATH,
    environ: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The profile from ATTUNE_PROFILE_JSON, else the model's 1-GPU entry in the catalog file."""
    environ = os.environ if environ is None else environ
    if environ.get("ATTUNE_PROFILE_JSON"):
        try:
            profile = json.loads(environ["ATTUNE_PROFILE_JSON"])
        except ValueError as exc:
            raise WorkloadError(f"ATTUNE_PROFILE_JSON is not JSON: {exc}") from exc
    else:
        try:
            data = json.loads(Path(catalog_path).read_text())
        except (OSError, ValueError) as exc:
            raise WorkloadError(f"cannot read the catalog {catalog_path}: {exc}") from exc
        models = data.get("profile_sets", {}).get(profile_set)
        if models is None:
            raise WorkloadError(f"unknown profile set {profile_set!r}")
        if model not in models:
            raise WorkloadError(f"unknown model {model!r}; valid: {', '.join(sorted(models))}")
        entry = models[model]["1"]
        profile = {
            "iter_time_s": entry["iter_time_s"],
            "cpu_per_gpu_grid": data["cpu_per_gpu_grid"],
            "mem_gb_per_gpu_grid": data["mem_gb_per_gpu_grid"],
            "tput": entry["tput"],
        }
    missing = {"iter_time_s", "cpu_per_gpu_grid", "mem_gb_per_gpu_grid", "tput"} - set(profile)
    if missing:
        raise WorkloadError(f"profile lacks {', '.join(sorted(missing))}")
    return profile


def tput(profile: dict[str, Any], cpus_per_gpu: float, mem_gb_per_gpu: float) -> float:
    """Normalised throughput at the largest grid points <= the allocation (the smallest below the grid)."""
    i = bisect_right([float(c) for c in profile["cpu_per_gpu_grid"]], cpus_per_gpu + EPS) - 1
    j = bisect_right([float(m) for m in profile["mem_gb_per_gpu_grid"]], mem_gb_per_gpu + EPS) - 1
    return float(profile["tput"][max(i, 0)][max(j, 0)])


def genie_iter_time_s(
    genie: dict[str, Any], *, batch: float, gpus_per_server: int, num_servers: int
) -> float:
    """GENIE's per-iteration time in seconds (no noise): the truth a profiling run must recover."""
    intra_steps = math.ceil(math.log2(gpus_per_server)) if gpus_per_server > 1 else 0
    cross_steps = math.log2(num_servers) if num_servers > 1 else 0.0
    return (
        float(genie["alpha_s"]) * batch
        + float(genie["beta_s"])
        + intra_steps * float(genie.get("t_intra_s") or 0.0)
        + cross_steps * float(genie.get("t_cross_s") or 0.0)
    )


def base_iter_time_s(
    profile: dict[str, Any], *, batch: int | None, num_gpus: int, environ: dict[str, str] | None = None
) -> tuple[float, dict[str, Any]]:
    """Seconds per iteration at the proportional point, and facts to log and report.

    Without a "genie" entry: the profile's iter_time_s (the batch is the profile's own). With one:
    GENIE's model at `batch` (default the entry's) on `num_gpus` GPUs of each of NNODES servers, with
    one noise draw for this launch.
    """
    environ = os.environ if environ is None else environ
    genie = profile.get("genie")
    if not genie:
        return float(profile["iter_time_s"]), {}
    b = batch or int(genie.get("batch") or 32)
    num_servers = max(1, int(environ.get("NNODES") or 1))
    t = genie_iter_time_s(genie, batch=b, gpus_per_server=num_gpus, num_servers=num_servers)
    noise = float(genie.get("noise", 0.01))
    factor = 1.0 + random.uniform(-noise, noise) if noise > 0 else 1.0
    facts = {"batch": b, "num_servers": num_servers, "noise_factor": factor}
    if genie.get("param_bytes"):
        facts["param_bytes"] = int(genie["param_bytes"])
    return t * factor, facts


def read_resources(path: str | None) -> dict[str, Any] | None:
    """The lease's resources file (ATTUNE_RESOURCES_FILE) if it is there and well formed."""
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
        if int(data["cpus"]) >= 1 and float(data["mem_gb"]) > 0:
            return data
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def granted_resources(environ: dict[str, str] | None = None) -> tuple[int, float, float]:
    """(num_gpus, cpus_per_gpu, mem_gb_per_gpu) of this process's allocation."""
    environ = os.environ if environ is None else environ
    num_gpus = max(1, len([d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]))
    resources = read_resources(environ.get("ATTUNE_RESOURCES_FILE"))
    if resources is not None:
        return num_gpus, int(resources["cpus"]) / num_gpus, float(resources["mem_gb"]) / num_gpus
    cpus = (
        int(environ["ATTUNE_CPUS_GRANTED"])
        if environ.get("ATTUNE_CPUS_GRANTED")
        else len(os.sched_getaffinity(0))
    )
    if environ.get("ATTUNE_MEM_GB"):
        mem_gb = float(environ["ATTUNE_MEM_GB"])
    else:
        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            mem_gb = soft / BYTES_PER_GB
        else:
            mem_gb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / BYTES_PER_GB
    return num_gpus, cpus / num_gpus, mem_gb / num_gpus


def _write_json(path: Path, data: dict[str, Any], *, durable: bool) -> None:
    # Atomic replace: the agent reads the progress file at any moment and must never see half of it.
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_checkpoint(path: Path | None) -> int:
    if path is None:
        return 0
    try:
        return int(json.loads(path.read_text())["done_iters"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    env = os.environ
    profile = load_profile(args.model, profile_set=args.profile_set, catalog_path=args.catalog)
    num_gpus, cpus_per_gpu, mem_gb_per_gpu = granted_resources()
    speed = tput(profile, cpus_per_gpu, mem_gb_per_gpu)
    if speed <= 0:
        raise WorkloadError(
            f"profile gives zero throughput at {cpus_per_gpu} cores, {mem_gb_per_gpu} GB per GPU"
        )
    time_scale = float(env.get("ATTUNE_TIME_SCALE") or 1.0)
    base_s, genie_facts = base_iter_time_s(profile, batch=args.batch, num_gpus=num_gpus)
    iter_s = base_s / speed * time_scale
    startup_s = float((profile.get("genie") or {}).get("startup_s") or 0.0)
    checkpoint_path = Path(env["ATTUNE_CHECKPOINT_PATH"]) if env.get("ATTUNE_CHECKPOINT_PATH") else None
    progress_path = Path(env["ATTUNE_PROGRESS_PATH"]) if env.get("ATTUNE_PROGRESS_PATH") else None
    resume_service = int(env.get("ATTUNE_RESUME_ITERS") or 0)
    resume_checkpoint = read_checkpoint(checkpoint_path)
    base = min(args.iters, max(resume_service, resume_checkpoint))
    log_every = args.log_every or max(1, args.iters // 20)
    # A memory footprint to exercise caps; held (as a local) until run() returns.
    _ballast = bytearray(args.mem_mb * 1024 * 1024) if args.mem_mb else None

    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))
    # The agent resized the lease in place: SIGWINCH (caught, hence asked for) says to look at the
    # resources file now; its modification time is also watched, for an agent that does not signal.
    resized: list[int] = []
    signal.signal(signal.SIGWINCH, lambda signum, _frame: resized.append(signum))
    resources_path = env.get("ATTUNE_RESOURCES_FILE") or None
    resources_mtime_ns = _mtime_ns(resources_path)

    print(
        f"model {args.model}: {num_gpus} GPU(s), {cpus_per_gpu:g} cores and {mem_gb_per_gpu:g} GB per GPU "
        f"-> tput {speed:g}, {iter_s:.6g} s/iter (time scale {time_scale:g})",
        flush=True,
    )
    if genie_facts:
        print(f"GENIE timing model: {genie_facts}", flush=True)
    if base:
        print(
            f"resuming from iteration {base} (checkpoint {resume_checkpoint}, service {resume_service})",
            flush=True,
        )
    if startup_s > 0:
        time.sleep(startup_s * time_scale)  # GENIE's s_0, in the workload's own time

    t0 = time.monotonic()
    # Measured like the torch workload's: time before the first iteration, in the workload's own time.
    measured_startup_s = (t0 - started) / time_scale
    iters_per_s = 1.0 / iter_s

    def done_at(now: float) -> int:
        return min(args.iters, base + int((now - t0) / iter_s))

    def save(done: int, *, checkpoint: bool) -> None:
        if progress_path is not None:
            data: dict[str, Any] = {"done_iters": done, "iters_per_s": iters_per_s, "total_iters": args.iters}
            if "param_bytes" in genie_facts:
                data["param_bytes"] = genie_facts["param_bytes"]
            if genie_facts:
                data["startup_s"] = measured_startup_s
            _write_json(progress_path, data, durable=False)
        if checkpoint and checkpoint_path is not None:
            _write_json(checkpoint_path, {"done_iters": done}, durable=True)

    last_logged = base // log_every
    next_progress = next_checkpoint = t0
    while True:
        now = time.monotonic()
        done = done_at(now)
        if stop:
            save(done, checkpoint=True)
            name = signal.Signals(stop[0]).name
            print(f"{name} received: checkpointed at iteration {done}/{args.iters}, exiting", flush=True)
            return 0
        boundary = done // log_every
        for k in range(max(last_logged + 1, boundary - 9), boundary + 1):  # at most 10 lines per wake-up
            print(f"iteration {k * log_every}/{args.iters}", flush=True)
        last_logged = max(last_logged, boundary)
        if done >= args.iters:
            save(done, checkpoint=True)
            elapsed = now - t0
            print(
                f"done: {done - base} iterations in {elapsed:.3f} s "
                f"({(done - base) / elapsed if elapsed > 0 else 0:.3f} it/s)",
                flush=True,
            )
            return 0
        if now >= next_checkpoint:
            save(done, checkpoint=True)
            next_checkpoint = now + args.checkpoint_every_s
            next_progress = now + args.progress_every_s
        elif now >= next_progress:
            save(done, checkpoint=False)
            next_progress = now + args.progress_every_s
        mtime_ns = _mtime_ns(resources_path) if resources_path else None
        if resized or mtime_ns != resources_mtime_ns:
            resized.clear()
            resources_mtime_ns = mtime_ns
            num_gpus, cpus_per_gpu, mem_gb_per_gpu = granted_resources()
            new_speed = tput(profile, cpus_per_gpu, mem_gb_per_gpu)
            if new_speed > 0 and new_speed != speed:
                # From now on at the new speed: the work done so far is kept, the clock restarts here.
                base, t0, speed = done, now, new_speed
                iter_s = base_s / speed * time_scale
                iters_per_s = 1.0 / iter_s
                print(
                    f"resized: {cpus_per_gpu:g} cores and {mem_gb_per_gpu:g} GB per GPU -> tput {speed:g}, "
                    f"{iter_s:.6g} s/iter",
                    flush=True,
                )
                save(done, checkpoint=False)
        finish_in = t0 + (args.iters - base) * iter_s - now
        time.sleep(max(0.0, min(TICK_S, finish_in + 1e-4)))


def _mtime_ns(path: str | None) -> int | None:
    try:
        return os.stat(path).st_mtime_ns if path else None
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.workload", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--iters", type=int, required=True)
    parser.add_argument(
        "--batch", type=int, default=None, help="per-GPU batch (GENIE's timing model only; default its own)"
    )
    parser.add_argument("--profile-set", default=DEFAULT_PROFILE_SET)
    parser.add_argument(
        "--catalog", type=Path, default=Path(os.environ.get("ATTUNE_CATALOG_PATH") or CATALOG_PATH)
    )
    parser.add_argument(
        "--log-every", type=int, default=0, help="iterations per log line (default: iters/20)"
    )
    parser.add_argument("--progress-every-s", type=float, default=0.5)
    parser.add_argument("--checkpoint-every-s", type=float, default=10.0)
    parser.add_argument("--mem-mb", type=int, default=0, help="hold this much memory (to exercise caps)")
    args = parser.parse_args(argv)
    if args.iters <= 0:
        parser.error("--iters must be positive")
    if args.batch is not None and args.batch <= 0:
        parser.error("--batch must be positive")
    try:
        return run(args)
    except WorkloadError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except MemoryError:
        print("MemoryError: the workload ran out of memory", file=sys.stderr, flush=True)
        return OOM_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
