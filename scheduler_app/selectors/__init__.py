"""Every read of the work tables, by subject; turns rows into the core's views (snapshot, jobs).

Import from here: the modules are an internal split (leases, rounds, jobs, queue, cluster, agents).
"""

from scheduler_app.selectors.agents import (
    PREEMPT_END_REASONS,
    JobPart,
    agent_commands,
    job_parts,
    rendezvous_env,
)
from scheduler_app.selectors.cluster import cluster_overview
from scheduler_app.selectors.jobs import (
    LeaseSpeed,
    dependency_pending_reason,
    dependency_waits,
    job_counts_by_state,
    job_detail_queryset,
    job_lease_speeds,
    job_list,
    job_log_tail,
    job_queue_page_queryset,
)
from scheduler_app.selectors.leases import ActiveLease, active_leases, server_busy_gpus
from scheduler_app.selectors.queue import QueueEntry, job_queue
from scheduler_app.selectors.rounds import (
    OWN_COMMAND_GUESS_ITER_S,
    OWN_COMMAND_GUESS_LENGTH_S,
    RoundInputs,
    borrowing_teams,
    job_num_nodes,
    next_round_at,
    own_command_iter_time_s,
    owner_usage_gpu_s,
    proportional_profile,
    round_inputs,
    team_quotas_left,
)

__all__ = [
    "OWN_COMMAND_GUESS_ITER_S",
    "OWN_COMMAND_GUESS_LENGTH_S",
    "PREEMPT_END_REASONS",
    "ActiveLease",
    "JobPart",
    "LeaseSpeed",
    "QueueEntry",
    "RoundInputs",
    "active_leases",
    "agent_commands",
    "borrowing_teams",
    "cluster_overview",
    "dependency_pending_reason",
    "dependency_waits",
    "job_counts_by_state",
    "job_detail_queryset",
    "job_lease_speeds",
    "job_list",
    "job_log_tail",
    "job_num_nodes",
    "job_parts",
    "job_queue",
    "job_queue_page_queryset",
    "next_round_at",
    "own_command_iter_time_s",
    "owner_usage_gpu_s",
    "proportional_profile",
    "rendezvous_env",
    "round_inputs",
    "server_busy_gpus",
    "team_quotas_left",
]
