"""opt's balanced server choice: where a job leaves the others what the LP planned for them.

A phase for `RoundState.walk` (placement/stages.py): opt walks it through the same stages as every
placement, so a job is first placed among what nobody held.
"""

from __future__ import annotations

from scheduler_app.core.allocators.opt_lp import EPS
from scheduler_app.core.placement import PACKED, Plan, RoundState
from scheduler_app.core.placement.stages import View


def find_balanced(
    state: RoundState,
    view: View,
    num_gpus: int,
    c: float,
    m: float,
    may_split: bool,
    rest: tuple[float, float],
    *,
    shape: tuple[int, int] | None = None,
) -> Plan | None:
    """Servers for the job where the others can still get what the LP planned for them.

    A server's imbalance is the squared distance, in proportional shares, between its leftover
    cores and memory and what its free GPUs would take at the average per-GPU demand of the
    jobs not yet placed. Squared, so that piling heavy jobs on one server costs more than
    spreading them, and so that surplus (cores light jobs would strand) counts as well as
    shortage. Whole placement: the server holding the job whose imbalance grows least (a light
    job thus lands where cores are scarce, a heavy one where they abound), then the fewest
    free GPUs, then the lowest position. When `may_split` (the job loses no speed across
    servers), the job is also spread GPU by GPU onto the server whose imbalance grows least
    each time, and that split wins if it is more balanced: a job asking for a whole server's
    cores on half its GPUs would otherwise strand the other half (the reference's LP2 splits
    jobs freely for the same reason). Otherwise jobs no single server holds are spread as
    tune spreads them (scores.PACKED). `view`: what the stage being walked offers (stages.py:
    unclaimed GPUs and unreserved room, ..., everything free), so the same choice is made
    first among what nobody held.
    `shape` (the job's node count, `RoundState.node_shape`): exactly that many servers with the
    same number of GPUs each, those whose imbalance grows least (then fewest free GPUs, then
    lowest position), or None. `rest`: the cores and GB the jobs not yet placed will ask for at
    their LP points.
    """
    # Spread over every GPU still free after this job: when fewer GPUs are admitted than free,
    # some stay idle, and a server need not fill all of them.
    free_after = state.free_gpu_count - num_gpus
    rate_cpus = rest[0] / free_after if free_after > 0 else 0.0
    rate_mem_gb = rest[1] / free_after if free_after > 0 else 0.0
    num_free, free_cpus, free_mem = view.counts, view.cpus, view.mem_gb
    prop_cpus, prop_mem = state.prop_cpus, state.prop_mem_gb

    # Per dimension the imbalance term is (R / prop)^2 with R = free - n * rate; k more GPUs at
    # demand c make R' = R - k * (c - rate), so the growth is k*d * (k*d - 2R) / prop^2 in
    # closed form (d = c - rate): this runs for every server and every job.
    d_cpus, d_mem_gb = c - rate_cpus, m - rate_mem_gb

    def growth(i: int, taken: int, k: int) -> float:
        """How much server i's imbalance grows when k more GPUs go to it after `taken`."""
        n = num_free[i] - taken
        out = 0.0
        pc, pm = prop_cpus[i], prop_mem[i]
        if pc > 0:
            r, kd = free_cpus[i] - taken * c - n * rate_cpus, k * d_cpus
            out += kd * (kd - 2.0 * r) / (pc * pc)
        if pm > 0:
            r, kd = free_mem[i] - taken * m - n * rate_mem_gb, k * d_mem_gb
            out += kd * (kd - 2.0 * r) / (pm * pm)
        return out

    if shape is not None:
        nodes, per_node = shape
        fits = sorted(
            (growth(i, 0, per_node), num_free[i], i)
            for i in range(state.num_servers)
            if num_free[i] >= per_node
            and free_cpus[i] + EPS >= per_node * c
            and free_mem[i] + EPS >= per_node * m
        )
        return sorted((i, per_node) for *_, i in fits[:nodes]) if len(fits) >= nodes else None
    need_cpus, need_mem_gb = num_gpus * c, num_gpus * m
    whole: tuple[float, int, int] | None = None
    for i in range(state.num_servers):
        n = num_free[i]
        if n < num_gpus or free_cpus[i] + EPS < need_cpus or free_mem[i] + EPS < need_mem_gb:
            continue
        key = (growth(i, 0, num_gpus), n, i)
        if whole is None or key < whole:
            whole = key
    if num_gpus > 1 and may_split:
        taken = [0] * state.num_servers
        split_cost = 0.0
        for _ in range(num_gpus):
            pick: tuple[float, int, int] | None = None
            for i in range(state.num_servers):
                t = taken[i]
                if (
                    num_free[i] - t < 1
                    or free_cpus[i] - (t + 1) * c < -EPS
                    or free_mem[i] - (t + 1) * m < -EPS
                ):
                    continue
                key = (growth(i, t, 1), num_free[i] - t, i)
                if pick is None or key < pick:
                    pick = key
            if pick is None:
                break
            split_cost += pick[0]
            taken[pick[2]] += 1
        else:
            plan = [(i, k) for i, k in enumerate(taken) if k > 0]
            if len(plan) > 1 and (whole is None or split_cost < whole[0] - 1e-6):
                return plan
    if whole is not None:
        return [(whole[2], num_gpus)]
    if num_gpus == 1:
        return None
    # Packed's plain rule over this stage's view: no preference among claimants' GPUs.
    return PACKED.place(view._replace(prefer=None), num_gpus, state.uniform(c), state.uniform(m))
