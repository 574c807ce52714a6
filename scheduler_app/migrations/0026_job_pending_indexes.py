"""Partial indexes on the pending jobs for a submission's count of the jobs ahead (PostgreSQL only)."""

from django.db import migrations

# services/admission_tail.py counts, at each submission under SWAF, the pending jobs certainly ahead of
# the new one and stops at the forecast's window (1,000), as services/admission_window.py's count does
# under FIFO. Through these the counts read the jobs ahead, not the
# whole table (a sequential scan of every pending, running and finished job: 10 ms at 10,000 pending
# for a job inside the window). None of their columns is written by a running job's progress
# (done_iters, attained service: those updates stay HOT), and each holds only pending jobs. SQL rather
# than the model's Meta.indexes: only PostgreSQL runs these counts, so the embedded SQLite demo does not
# maintain them, and the model's state is unchanged.
INDEXES = {
    # A higher priority; at a priority, each (workload, GPU count) by total_iters.
    "scheduler_app_job_pending_ahead": "(priority, workload_id, num_gpus, total_iters) "
    "WHERE state = 'PENDING' AND NOT held",
    # FIFO's order: at a priority, by arrival (read in order, it stops at the window's last job).
    "scheduler_app_job_pending_fifo": "(priority, submitted_at, id) WHERE state = 'PENDING' AND NOT held",
    # At a priority, the jobs with a QoS target (few).
    "scheduler_app_job_pending_qos": "(priority) WHERE state = 'PENDING' AND NOT held AND "
    "(qos_deadline_at IS NOT NULL OR qos_max_latency_s IS NOT NULL OR qos_min_rate_iters_per_s IS NOT NULL)",
    # At a priority, the jobs that have run (preempted or requeued: done_iters may be above 0).
    "scheduler_app_job_pending_started": "(priority) WHERE state = 'PENDING' AND NOT held "
    "AND started_at IS NOT NULL",
}


def create_indexes(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, definition in INDEXES.items():
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON scheduler_app_job {definition}")


def drop_indexes(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("scheduler_app", "0025_round_num_resized")]
    operations = [migrations.RunPython(create_indexes, drop_indexes)]
