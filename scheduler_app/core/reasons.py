"""Stable reason codes for round decisions; shown verbatim in the UI and the API."""

# Placed: which operating point the job got.
BEST_CASE = "best_case"  # its best-case CPU/memory demand (Synergy)
PROPORTIONAL = "proportional"  # the GPU-proportional share of each server it runs on
REVERTED_TO_PROPORTIONAL = "reverted_to_proportional"  # tune took its surplus back for a peer
INTERMEDIATE = "intermediate"  # a matrix point between proportional and best case
LP_SHARE = "lp_share"  # the share the OPT linear program chose
FIXED_DEMAND = "fixed_demand"  # the user's explicit CPU/memory override
QOS_FIT = "qos_fit"  # the smallest CPU/memory point that still meets its QoS target (GENIE)
BACKFILLED = "backfilled"  # placed ahead of a QoS job's reservation without delaying it (GENIE)
LEFTOVER = "leftover"  # grown past its QoS fit with cores/memory nobody else was given (GENIE)

# Pending: may fit in a later round.
# not enough free GPUs after jobs ahead in policy order (a job with num_nodes = N: fewer than N
# servers with num_gpus / N free GPUs each)
INSUFFICIENT_GPUS = "insufficient_gpus"
FRAGMENTED = "fragmented"  # enough GPUs (in its num_nodes shape), but not with the CPU/memory they need
QOS_UNATTAINABLE = "qos_unattainable"  # its deadline can no longer be met (GENIE best-effort tail)
# its minimum rate is above even its best-case speed on this cluster: it runs best effort (GENIE)
MIN_RATE_UNATTAINABLE = "min_rate_unattainable"
# free GPUs only spread over more servers than its QoS target allows: the slowdown of spreading
# (the predictor's cross-server time, or the learnt placement penalty) would make it miss (GENIE)
QOS_NEEDS_FEWER_SERVERS = "qos_needs_fewer_servers"
# free GPUs only next to communicating jobs, and the interference (GENIE's 1 + kappa x) would cost its
# QoS target or theirs (GENIE)
QOS_INTERFERENCE = "qos_interference"
RESERVED_FOR_QOS = "reserved_for_qos"  # would delay the reservation of a QoS job ahead of it (GENIE)
QUOTA_EXCEEDED = "quota_exceeded"  # its team's GPU quota is used by jobs ahead of it (or held)

# Infeasible: can never fit on this cluster as it is.
EXCEEDS_CLUSTER_GPUS = "exceeds_cluster_gpus"
EXCEEDS_SERVER_RESOURCES = "exceeds_server_resources"  # a fixed demand no server could ever hold
# Fewer than num_nodes servers could ever hold num_gpus / num_nodes GPUs (with its fixed demand).
EXCEEDS_CLUSTER_NODES = "exceeds_cluster_nodes"
UNEVEN_NODE_SPLIT = "uneven_node_split"  # num_gpus is not a multiple of num_nodes

# Placed beyond its team's quota on GPUs no job within its quota wanted (Kueue's borrowing); such
# jobs come after every job within quota, so they are the first to lose their GPUs when needed.
BORROWED = "borrowed"

# Placed: kept where it runs although the allocator would have changed it (core/move_guard.py).
MIN_RUN_TIME = "min_run_time"  # its lease started less than the minimum run time ago
RESTART_COST = "restart_cost"  # the change would not have paid for the restarts it causes

PLACED_REASONS = frozenset(
    {
        BORROWED,
        MIN_RUN_TIME,
        RESTART_COST,
        BEST_CASE,
        PROPORTIONAL,
        REVERTED_TO_PROPORTIONAL,
        INTERMEDIATE,
        LP_SHARE,
        FIXED_DEMAND,
        QOS_FIT,
        BACKFILLED,
        LEFTOVER,
    }
)
PENDING_REASONS = frozenset(
    {
        INSUFFICIENT_GPUS,
        FRAGMENTED,
        QOS_UNATTAINABLE,
        MIN_RATE_UNATTAINABLE,
        QOS_NEEDS_FEWER_SERVERS,
        QOS_INTERFERENCE,
        RESERVED_FOR_QOS,
        QUOTA_EXCEEDED,
    }
)
INFEASIBLE_REASONS = frozenset(
    {EXCEEDS_CLUSTER_GPUS, EXCEEDS_SERVER_RESOURCES, EXCEEDS_CLUSTER_NODES, UNEVEN_NODE_SPLIT}
)
