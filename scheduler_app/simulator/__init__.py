"""Trace-driven, round-based simulator that calls the same scheduling core as the live service.

Pure Python (+numpy); never imports Django. Public API:

- `simulate(trace, cluster, *, policy, allocator, round_s=300, finish_at_round_end=False,
  restart_overhead_s=0.0, catalog=None, first_round_s=None, measured_job_ids=None,
  stop_when_measured=False, max_time_s=None, progress=None, mode="rounds") -> SimulationResult`
  Replays `trace` (a list of TraceJob) on `cluster` (ClusterSpec), calling
  `scheduler_app.core.engine.schedule_round` once per round. `policy`/`allocator` are registered names
  (unknown ones raise `scheduler_app.core.registry.UnknownNameError`, listing the valid names) or
  instances. `finish_at_round_end=True` reproduces the reference (msr-fiddle/synergy) simulator's
  convention; the default finishes jobs at the exact time inside the round. See docs/reference-synergy.md.
  `mode="events"` decides at every arrival and completion (GENIE) instead of on the round grid.
  Under a static order (fifo), an allocator that reads no progress and no restart guard, a round whose
  inputs repeat the last one's reuses its plan (exact; allocators must be pure, see docs/simulator.md).
- Command line without Django: `python -m scheduler_app.simulator` (cli.py; manage.py simulate's
  options but `--store`); the comparison of policies x allocators is compare.py's simulation_compare.
- `forecast(snapshot, jobs, *, policy, allocator, first_round_s, ...)` (simulator/forecast.py): the
  live queue played forward with no arrivals: predicted start and finish per job (admission feedback).
- `ClusterSpec(servers=16, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)`.
- `TraceJob(job_id, model, arrival_s, total_iters, num_gpus)`; `read_trace(path)`, `write_trace(path,
  jobs)`, `parse_trace(lines, source=...)`: the reference format `job_id,model,arrival_s,total_iters,gpus`
  (no header). Bad rows raise `TraceError` (a ValueError) naming the file and line.
- `philly_derived_trace(num_jobs, *, jobs_per_hour=9.0, class_split=(20, 70, 10), multi_gpu=False,
  seed=42, static=False, assignment="overall")`: Synergy's Philly-derived workload generator.
- `genie_trace(num_jobs, *, jobs_per_hour=6.0, ..., seed=42)`: GENIE's QoS workload (PAPERS.md §2.3):
  Poisson arrivals, CNN-heavy mix, deadline = arrival + f x standalone best time, urgent bursts.
  `TraceJob.deadline_s` (optional sixth trace column) reaches the core as `JobView.deadline_s`;
  `TraceJob.min_rate_iters_per_s` (sixth column `min_rate=R`; `genie_trace(min_rate_share=...)`) as
  `JobView.min_rate_iters_per_s`.
- `SimulationResult`: `avg_jct_h`, `median_jct_h`, `p99_jct_h`, `makespan_h`, `gpu_alloc_pct`,
  `cpu_alloc_pct`, `mem_alloc_pct`, `cpu_util_pct`, `mem_util_pct`, `rounds`, `wall_s`, per-job
  `records` (JobRecord), QoS figures `qos` (to_dict: `qos_jobs`, `qos_pct`, `tardiness_h`), the
  minimum-rate kind's `min_rate` (to_dict: `min_rate_jobs`, `min_rate_pct`) and the
  per-round `utilisation` series; `to_dict(include_records=True,
  include_series=True)` and `summary()` give JSON-ready dicts.
"""

from scheduler_app.simulator.cluster import ClusterSpec
from scheduler_app.simulator.metrics import (
    JctStats,
    JobRecord,
    SimulationResult,
    UtilisationSeries,
    jct_stats,
)
from scheduler_app.simulator.simulation import default_first_round_s, simulate
from scheduler_app.simulator.trace import (
    TraceError,
    TraceJob,
    format_trace_line,
    parse_trace,
    read_trace,
    write_trace,
)
from scheduler_app.simulator.workloads import genie_trace, philly_derived_trace, standalone_best_s

__all__ = [
    "ClusterSpec",
    "JctStats",
    "JobRecord",
    "SimulationResult",
    "TraceError",
    "TraceJob",
    "UtilisationSeries",
    "default_first_round_s",
    "format_trace_line",
    "genie_trace",
    "jct_stats",
    "parse_trace",
    "philly_derived_trace",
    "read_trace",
    "simulate",
    "standalone_best_s",
    "write_trace",
]
