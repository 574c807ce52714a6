"""Celery task names: tasks declare them, services send tasks by them (services never import tasks)."""

# The values are the names Celery gave these tasks before they were declared explicitly, so that messages
# already queued, the beat schedule and the routes in settings keep matching.
SCHEDULING_ROUND_TASK = "scheduler_app.tasks.scheduling_round_task"
NODE_LIVENESS_SWEEP_TASK = "scheduler_app.tasks.node_liveness_sweep_task"
AGENT_REPORTS_APPLY_TASK = "scheduler_app.tasks.agent_reports_apply_task"
USAGE_ROLLUP_TASK = "scheduler_app.tasks.usage_rollup_task"
WORKLOAD_PROFILE_TASK = "scheduler_app.tasks.workload_profile_task"
SIMULATION_RUN_TASK = "scheduler_app.tasks.simulation_run_task"
FORECAST_REFRESH_TASK = "scheduler_app.tasks.forecast_refresh_task"
ADMISSION_FORECAST_TASK = "scheduler_app.tasks.admission_forecast_task"
