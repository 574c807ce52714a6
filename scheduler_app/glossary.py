"""The one glossary: every policy, allocator, reason code, state, event and term the pages show, in one line.

Pure data (no Django): the templates explain a term with `{% load glossary %}` (`{{ term|explain }}`,
`{% term value "code" %}`), /glossary/ lists it all, and tests/web/test_glossary.py checks that every
name the code accepts or emits (policies, allocators, pending and decision reasons, job states and
events, server states, isolation modes) has its line here. Keys are the exact strings the code
writes, so lookups are case-sensitive: `completed` (an event) and `COMPLETED` (a state) differ.
"""

from __future__ import annotations

POLICIES = {
    "fifo": "First in, first out: jobs run in the order they were submitted.",
    "srtf": "Shortest remaining time first: the job closest to finishing runs first.",
    "sjf": "Shortest job first: the shortest predicted remaining run time first; deadlines are ignored.",
    "las": "Least attained service: the job that has had the fewest GPU-seconds so far runs first.",
    "ftf": "Finish-time fairness (Themis): the job doing worst against running alone on its share "
    "goes first.",
    "fairshare": "Fair share: the user with the least recent GPU time goes first, one job at a time.",
    "edf": "Earliest deadline first: jobs with the nearest QoS deadline first, then minimum-rate jobs, then "
    "the rest.",
    "swaf": "Shortest waiting allowance first (GENIE): least slack before the deadline first, then "
    "minimum-rate jobs, then late QoS jobs, then jobs without a QoS target, shortest first (one that "
    "has waited long goes ahead: aging).",
}

ALLOCATORS = {
    "proportional": "GPU-proportional: each GPU brings its server's share of CPU cores and memory "
    "(as a placement reason: the job got exactly that share).",
    "greedy": "Synergy-GREEDY: each job gets its best-case cores and memory, first fit; a job that "
    "does not fit waits.",
    "tune": "Synergy-TUNE: best-case cores and memory where they fit, the proportional share where "
    "not; never less than proportional.",
    "tune_matrix": "TUNE that also tries the profiled points between proportional and best case "
    "before falling back to proportional.",
    "opt": "Synergy-OPT: a linear program finds the most throughput the round could give, and "
    "placements follow its shares.",
    "genie": "GENIE: the smallest allocation that still meets each job's deadline or minimum rate, with "
    "reservations and backfill (as a what-if trace: GENIE's workload, every job with a deadline).",
}

# Why a round placed a job as it did (scheduler_app/core/reasons.py, PLACED_REASONS).
PLACEMENT_REASONS = {
    "best_case": "Placed with its best-case CPU cores and memory: the most that still speeds it up.",
    "reverted_to_proportional": "Placed at the proportional share: TUNE took back its extra cores and "
    "memory for another job.",
    "intermediate": "Placed at a profiled point between the proportional share and its best case.",
    "lp_share": "Placed at the share chosen by OPT's linear program.",
    "fixed_demand": "Placed with exactly the cores and memory its owner asked for.",
    "qos_fit": "Placed with the fewest cores and memory that still meet its deadline or minimum rate "
    "(GENIE).",
    "backfilled": "Placed ahead of a QoS job's reservation without delaying it (GENIE).",
    "leftover": "Given cores and memory beyond its QoS fit that no other job was given (GENIE).",
    "borrowed": "Placed beyond its team's quota on GPUs no job within quota wanted; first to be preempted.",
    "min_run_time": "Kept where it runs: its run started less than the minimum run time ago, so it is not "
    "moved or preempted for another job (a node lost or drained, or a deadline that cannot wait, still "
    "move it).",
    "restart_cost": "Kept where it runs: the round's better plan would not have paid for the restarts it "
    "causes (each costs a start-up and the work since the last checkpoint).",
}

# Why a round left a job waiting, or can never place it (core/reasons.py PENDING_, INFEASIBLE_REASONS).
DECISION_REASONS = {
    "insufficient_gpus": "Not enough free GPUs once the jobs ahead of it in the policy's order are placed.",
    "fragmented": "Enough free GPUs, but not with the CPU cores and memory they need.",
    "qos_unattainable": "Its deadline can no longer be met: it runs best effort, after the jobs that can.",
    "min_rate_unattainable": "Even its best case on this cluster is slower than its minimum rate: it runs "
    "best effort, after the jobs that can meet theirs.",
    "qos_needs_fewer_servers": "Free GPUs exist only spread over more servers than its deadline or rate "
    "allows (spreading would make it too slow, as its workload's profile predicts): it waits for GPUs on "
    "fewer servers.",
    "qos_interference": "Free GPUs exist only next to jobs that communicate as much as it does, and "
    "sharing their servers would make it or them miss a deadline or rate: it waits for GPUs elsewhere.",
    "reserved_for_qos": "Starting it would delay the reservation of a QoS job ahead of it.",
    "quota_exceeded": "Its team's GPU quota is used by jobs ahead of it.",
    "exceeds_cluster_gpus": "It asks for more GPUs than the whole cluster has.",
    "exceeds_server_resources": "No server could ever hold the CPU cores or memory it asks for.",
    "exceeds_cluster_nodes": "Fewer servers than it needs could ever hold its share of GPUs.",
    "uneven_node_split": "Its GPU count does not divide evenly over its number of servers.",
}

# A pending job's reason, in squeue's words (scheduler_app.models.PendingReason).
PENDING_REASONS = {
    "None": "Not waiting.",
    "Priority": "Jobs ahead of it in the queue come first.",
    "Resources": "First in line, waiting for enough GPUs, cores and memory to be free.",
    "Profiling": "Its workload is being profiled before it can be placed well.",
    "QoSUnattainable": "Its QoS target can no longer be met.",
    "QuotaExceeded": "Its team is at its GPU quota.",
    "JobHeldUser": "Held by its owner: release it to queue it again.",
    "JobHeldAdmin": "Held by an administrator, who alone can release it.",
    "Dependency": "It waits for the jobs it depends on to complete.",
    "DependencyNeverSatisfied": "A job it depends on ended without completing: cancel it or resubmit.",
    "Infeasible": "It can never fit on this cluster as it is.",
    "JobArrayTaskLimit": "Its array already runs as many tasks at once as its limit (--array ...%N) allows.",
}

# Slurm's job states (scheduler_app.models.JobState).
JOB_STATES = {
    "PENDING": "Waiting in the queue; its reason says why.",
    "RUNNING": "Running on its allocated GPUs.",
    "COMPLETED": "Finished its work (exit code 0).",
    "FAILED": "Ended with an error (a non-zero exit code, a signal, or it could not start).",
    "CANCELLED": "Cancelled by its owner or an administrator.",
    "PREEMPTED": "Stopped to give its resources to other jobs; it goes back to the queue with its progress.",
    "TIMEOUT": "Stopped at its time limit.",
    "NODE_FAIL": "Its server stopped answering; it goes back to the queue with its progress.",
    "OUT_OF_MEMORY": "Killed for using more memory than it was given.",
}

# JobEvent.kind: what happened to a job (written by scheduler_app/services).
JOB_EVENTS = {
    "submitted": "The job entered the queue.",
    "scheduled": "A scheduling round placed it; its reason says at which share.",
    "preempted": "A round took its resources (to move it, or for jobs ahead of it).",
    "rescheduled": "Preempted and placed again in the same round, elsewhere or with another share.",
    "resized": "Given other CPU cores or memory on the same GPUs while it runs, without a restart (the "
    "agent changes the running processes' limits and tells the job).",
    "requeued": "Back in the queue, progress kept (after a preemption, a node failure or an agent stop).",
    "node_fail": "A server it ran on stopped answering.",
    "lease_started": "A node agent started it; the reason names the isolation mode.",
    "lease_exited": "Its process on a node ended; the reason says how.",
    "progress_clamped": "The agent reported more iterations than the job has; counted as its total.",
    "speed_outlier": "A reported speed was not believable and was left out of the speed estimates.",
    "held": "Held: kept out of the queue until released.",
    "released": "Released from a hold: back in the queue.",
    "updated": "Its time limit, or its array's limit on tasks at once, was changed (scontrol update).",
    "profiling": "Waiting while its workload is profiled.",
    "dependency_never_satisfied": "A job it depends on ended without completing.",
    "completed": "It finished its work.",
    "failed": "It ended with an error.",
    "cancelled": "It was cancelled.",
    "timeout": "It reached its time limit.",
    "out_of_memory": "It was killed for using more memory than it was given.",
}

# Reasons written with job events and ended leases (services), beyond the states and decisions above.
EVENT_REASONS = {
    "moved": "Preempted to be placed again elsewhere or with another share.",
    "node_down": "Its server was marked down.",
    "cancelled_by_user": "Its owner or an administrator cancelled it.",
    "time_limit": "It ran past its time limit.",
    "oom": "The node's memory limit killed it.",
    "finished_on_preemption": "It finished its work during the grace period of a preemption.",
    "above_total_iters": "The agent reported more iterations than the job has.",
    "above_max_speed": "The reported speed is above any believable speed.",
    "far_from_prediction": "The reported speed is many times off the profile's prediction.",
    "start_failed": "The agent could not start the process.",
    "lost": "The agent lost the process.",
    "incomplete": "The process exited 0 before doing all its iterations.",
    "exited": "The process exited.",
}

# Slurm's node states (cluster_app.models.NodeState).
SERVER_STATES = {
    "IDLE": "Up, no job on it.",
    "MIXED": "Up, some GPUs in use.",
    "ALLOCATED": "Up, every GPU in use.",
    "DRAINING": "Taking no new jobs; the running ones finish first.",
    "DRAINED": "Taking no jobs, none running: ready for maintenance.",
    "DOWN": "Not in service.",
    "NOT_RESPONDING": "Its agent has not synced for a while (it may be down or cut off).",
}

# How a node agent confines a job (agent/launcher.py ISOLATION_MODES).
ISOLATION_MODES = {
    "systemd-run": "A transient systemd scope per job: cgroup v2 caps on its cores and memory.",
    "affinity+rlimit": "No cgroup available: pinned to its cores (sched_setaffinity), memory capped "
    "by RLIMIT_AS.",
}

TERMS = {
    "JCT": "Job completion time: from submission to completion, waiting included.",
    "QoS": "Quality of service: a deadline, a maximum latency or a minimum rate (iterations/s) a job was "
    "promised.",
    "makespan": "Time from the first job's submission to the last job's completion.",
    "p99": "99th percentile: 99 % of the values are at most this.",
    "philly": "Synergy's Philly-derived job mix, for what-if runs: no job has a QoS target.",
    "allocated": "What leases held (GPUs, cores, GB x time) over the cluster's capacity.",
    "measured": "What the node agents reported: NVML GPU utilisation, the servers' CPU and memory.",
    "speed correction": "Measured over predicted speed of a workload, learnt from its finished jobs.",
    "placement penalty": "How much slower a workload runs spread over several servers than on one.",
    "waiting allowance": "Deadline minus now minus the best-case remaining run time (SWAF's key).",
}

# (title, entries) in the order /glossary/ shows them.
SECTIONS: tuple[tuple[str, dict[str, str]], ...] = (
    ("Policies: the order of the queue", POLICIES),
    ("Allocators: what each job gets", ALLOCATORS),
    ("Placement reasons", PLACEMENT_REASONS),
    ("Why a round left a job waiting", DECISION_REASONS),
    ("Pending reasons", PENDING_REASONS),
    ("Job states", JOB_STATES),
    ("Job events", JOB_EVENTS),
    ("Event reasons", EVENT_REASONS),
    ("Server states", SERVER_STATES),
    ("Isolation modes", ISOLATION_MODES),
    ("Terms", TERMS),
)

GLOSSARY: dict[str, str] = {term: line for _, entries in SECTIONS for term, line in entries.items()}


def explain(term: object) -> str | None:
    """The one-line explanation of `term` (the exact string the code writes), or None."""
    return GLOSSARY.get(str(term)) if term is not None else None
