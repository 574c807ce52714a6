"""A round against a transaction that holds a job row the round writes and re-checks a lease's foreign keys.

Found by the fault tests (deadlocks in PostgreSQL's log under ordinary load): a transaction applying
an agent's reports locks a job, and updates that job's lease row twice (job_finish ends it, then the
reports' fields are written). PostgreSQL re-checks every foreign key of a row updated twice in one
transaction at COMMIT (Django's are DEFERRABLE INITIALLY DEFERRED), taking FOR KEY SHARE on the
lease's server. A round locks every server, then waits for the job rows it is about to write: if its
server lock were FOR UPDATE, the COMMIT would wait for the round and the round for the COMMIT, and
PostgreSQL would kill one of them. The round takes FOR NO KEY UPDATE, which a foreign key check does
not wait for.

Reproduced deterministically here: the test holds such a transaction open with psycopg2 (the row of
a queued job that the round will place, locked as a cancel would, and a running job's lease updated
twice, as an exit report would) while a real round (`scheduling_round_run` in a `manage.py shell`
process) blocks on that row, then commits. A round locks only the rows it writes
(round_plan_recheck), hence a queued job: the running job's lease continues, unwritten.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.faults.processes import PYTHON, REPO_ROOT, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

ROUND = (
    "from scheduler_app.services.rounds import scheduling_round_run; "
    "r = scheduling_round_run(trigger='lock-order-test'); print('ROUND', r.pk if r else None)"
)


def test_round_does_not_deadlock_with_a_report_transaction(stack):
    t_start = time.monotonic()
    ids = stack.submit_ok(name="lock-order", seconds=30)
    wait_until(
        lambda: stack.running_without_lease() == [] and stack.job_states(ids)[ids[0]] == "RUNNING",
        timeout_s=40,
        what="the job to run",
        diagnose=lambda: stack.describe(ids),
    )
    stack.kill_worker()  # no round but ours
    job_id = ids[0]
    lease_id = stack.scalar(
        "SELECT id FROM scheduler_app_allocation WHERE job_id = %s AND ended_at IS NULL", [job_id]
    )
    queued_id = stack.submit_ok(name="lock-order-queued", seconds=30)[0]  # placed by our round

    conn = stack.pg.connect(stack.dbname)
    conn.autocommit = False
    cur = conn.cursor()
    # The queued job's row, locked as a cancel would; then what applying an exit report does to the
    # running job: lock it, end its lease, write the reports' fields (the lease row updated twice).
    cur.execute("SELECT id FROM scheduler_app_job WHERE id = %s FOR UPDATE", [queued_id])
    cur.execute("SELECT id FROM scheduler_app_job WHERE id = %s FOR UPDATE", [job_id])
    cur.execute(
        "UPDATE scheduler_app_job SET attained_service_gpu_s = attained_service_gpu_s WHERE id = %s", [job_id]
    )
    cur.execute("UPDATE scheduler_app_allocation SET log_tail = log_tail || '' WHERE id = %s", [lease_id])
    cur.execute("UPDATE scheduler_app_allocation SET log_tail = log_tail || '' WHERE id = %s", [lease_id])

    round_proc = subprocess.Popen(
        [PYTHON, "manage.py", "shell", "-c", ROUND],
        cwd=REPO_ROOT,
        env=stack.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # The round holds the servers and waits for the queued job's row: a backend that ours blocks
        # (by its lock, not by its text: the round's statements run as EXECUTE of prepared ones) and
        # that holds locks on server rows (RowShareLock on their table); an agent's sync waiting for
        # the running job's row holds none.
        ours = conn.get_backend_pid()
        wait_until(
            lambda: stack.sql(
                "SELECT 1 FROM pg_stat_activity a"
                " WHERE a.wait_event_type = 'Lock' AND %s = ANY(pg_blocking_pids(a.pid))"
                " AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid"
                " AND l.relation = 'cluster_app_server'::regclass AND l.mode = 'RowShareLock')",
                [ours],
            ),
            timeout_s=30,
            what="the round to wait for the queued job's row",
            interval_s=0.1,
            diagnose=lambda: (
                f"round process: {round_proc.poll()}; activity: "
                + repr(
                    stack.sql(
                        "SELECT pid, state, wait_event_type, left(query, 150) FROM pg_stat_activity "
                        "WHERE datname = current_database()"
                    )
                )
            ),
        )
        commit_error = None
        try:
            conn.commit()
        except Exception as exc:  # psycopg2's DeadlockDetected, to be reported as the failure
            commit_error = exc
        out, _ = round_proc.communicate(timeout=60)
    finally:
        if round_proc.poll() is None:
            round_proc.kill()
        conn.close()
    print(
        f"[lock-order] job {job_id}, lease row {lease_id}: report transaction committed: "
        f"{commit_error is None}; round: {out.strip().splitlines()[-1] if out.strip() else '?'}; "
        f"{time.monotonic() - t_start:.0f} s"
    )
    assert commit_error is None, f"the report transaction failed: {commit_error!r}\nround: {out[-3000:]}"
    assert round_proc.returncode == 0 and "ROUND " in out and "deadlock" not in out, out[-3000:]
    assert stack.job_states([queued_id])[queued_id] == "RUNNING"  # the round went on and placed it
