"""Thin views of the user pages: validate, call one service or selector, render."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from cluster_app.selectors import server_get_by_name
from cluster_app.services import ServerStateError
from scheduler_app.conf import scheduler_conf
from scheduler_app.dashboards.prediction_accuracy import job_prediction_accuracy
from scheduler_app.durations import format_duration
from scheduler_app.models import TERMINAL_JOB_STATES, Job, JobState
from scheduler_app.selectors import (
    cluster_overview,
    job_detail_queryset,
    job_details_visible,
    job_estimate,
    job_lease_speeds,
    job_list,
    job_log_tail,
    job_manageable,
    job_queue,
    job_queue_page_queryset,
    job_restarts,
)
from scheduler_app.services.admission_judge import qos_at_risk_message
from scheduler_app.services.forecast_as_of import forecast_confirmed_at, job_estimate_as_of
from scheduler_app.services.job_control import (
    JobStateError,
    job_array_update,
    job_cancel,
    job_hold,
    job_release,
    job_release_allowed,
    job_update,
)
from scheduler_app.services.jobs import job_submit as jobs_submit
from scheduler_app.services.nodes import node_drain, node_resume
from scheduler_app.web.access import staff_required
from scheduler_app.web.forms import DEFAULT_QUEUE_STATES, JobLimitsForm, JobSubmitForm, QueueFilter
from scheduler_app.web.queue_rows import queue_rows

QUEUE_PAGE_SIZE = 100


@login_required
def queue(request: HttpRequest) -> HttpResponse:
    """squeue in a page: every user's jobs (only one's own with ATTUNE_PRIVATE_JOBS), filtered, 100 a
    page, each with its position and the current forecast (the same the job page and the API show)."""
    data = request.GET.copy()
    if not data.getlist("state"):
        data.setlist("state", list(DEFAULT_QUEUE_STATES))
    jobs = QueueFilter(data, queryset=job_queue_page_queryset(user=request.user), request=request)
    # squeue's rows: an array's pending tasks with one reason on one row, but with -r (tasks=1) or
    # when one array is asked for (as `attune queue --array`).
    each_task = request.GET.get("tasks") == "1" or bool(request.GET.get("array_job"))
    groups = queue_rows(jobs.qs, each_task=each_task)
    page = Paginator(groups, QUEUE_PAGE_SIZE).get_page(request.GET.get("page"))
    # A shared row shows its first task, and finishes when its last task is estimated to (as `queue`).
    shown = jobs.qs.in_bulk([pk for group in page for pk in {group.job_ids[0], group.job_ids[-1]}])
    positions = job_queue(job_ids=[pk for pk, job in shown.items() if job.state == JobState.PENDING])
    rows = []
    for group in page:
        job, last = shown[group.job_ids[0]], shown[group.job_ids[-1]]
        estimate = job_estimate(job)
        rows.append(
            (job, positions.get(job.pk), estimate, group, job_estimate(last) if group.label else estimate)
        )
    query = data.copy()
    query.pop("page", None)
    tasks_query = query.copy()  # the same filters, with arrays' tasks on one row or one each
    tasks_query.pop("tasks", None)
    if not each_task:
        tasks_query["tasks"] = "1"
    return render(
        request,
        "web/queue.html",
        {
            "filter": jobs,
            "page": page,
            "rows": rows,
            "job_count": sum(group.task_count for group in groups),
            "each_task": each_task,
            "collapsed": any(group.label for group in groups),
            "tasks_query": tasks_query.urlencode(),
            "estimates_confirmed_at": forecast_confirmed_at(),
            "query": query.urlencode(),
            "everyone": request.user.is_staff or not scheduler_conf().private_jobs,
        },
    )


@login_required
def job_submit(request: HttpRequest) -> HttpResponse:
    """The submission form; a valid job goes to the queue (services' job_submit, as the API) and its page."""
    form = JobSubmitForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        try:
            jobs = jobs_submit(owner=request.user, request=form.to_request())
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            job = jobs[0]
            what = (
                f"Job {job.pk} ({job.name}) submitted."
                if job.array_job_id is None
                else f"Array of {len(jobs)} tasks submitted: jobs {jobs[0].pk} to {jobs[-1].pk}."
            )
            at_risk = qos_at_risk_message(_admission_prediction(job))
            if at_risk:  # accepted, but said plainly: amber, with the predicted finish
                messages.warning(request, f"{what} {at_risk}")
            else:
                messages.success(request, what)
            return redirect("web:job", pk=job.pk)
    return render(request, "web/submit.html", {"form": form})


def _admission_prediction(job: Job) -> Any:
    """The job's stored admission prediction, or None (none yet, or no such model in this version)."""
    try:
        return getattr(job, "admission_prediction", None)
    except ObjectDoesNotExist:
        return None


@login_required
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """A job: where it stands, its prediction, timeline, leases with speeds, log tail, cancel."""
    # Scoped to what the user may see: another user's job is a 404, not a 403 (no existence leak).
    job = get_object_or_404(job_detail_queryset(user=request.user), pk=pk)
    return render(request, "web/job.html", _job_context(request, job))


def _off_by(predicted: datetime | None, actual: datetime | None) -> str:
    """How far what happened was from the prediction, in words ("12 min later"); "" if either is unknown."""
    if predicted is None or actual is None:
        return ""
    seconds = (actual - predicted).total_seconds()
    if abs(seconds) < 60:
        return "on time (within a minute)"
    words = format_duration(abs(seconds))  # the one readable-duration helper ("12 min", "1.5 h")
    return f"{words} {'later' if seconds > 0 else 'earlier'}"


def _job_context(request: HttpRequest, job: Job) -> dict[str, Any]:
    """What the job page (and its live fragment) shows: another user's job without what it runs and
    writes, and without the buttons."""
    entry = job_queue(job_ids=[job.pk]).get(job.pk) if job.state == JobState.PENDING else None
    mine = job_details_visible(job, request.user)
    prediction = _admission_prediction(job)
    return {
        "start_error": prediction and _off_by(prediction.predicted_start_at, job.started_at),
        "finish_error": prediction and _off_by(prediction.predicted_finish_at, job.finished_at),
        "job": job,
        "details_visible": mine,
        "queue_entry": entry,
        "estimate": job_estimate(job),
        "estimate_as_of": job_estimate_as_of(job),
        "prediction": prediction,
        "speeds": job_lease_speeds(job=job),
        "restarts": job_restarts(job),  # read from job_detail_queryset's annotations: no query
        "accuracy": job_prediction_accuracy(job=job),
        "log_lines": job_log_tail(job=job) if mine else [],
        "can_cancel": mine and job.state not in TERMINAL_JOB_STATES,
        "can_hold": mine and job.state == JobState.PENDING and not job.held,
        "can_release": mine and job.held and job_release_allowed(job, request.user),
        "can_update": mine and job.state in (JobState.PENDING, JobState.RUNNING),
        "progress_pct": 100.0 * job.done_iters / job.total_iters if job.total_iters else 0.0,
    }


@require_POST
@login_required
def job_cancel_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Cancel a job the user owns (staff: any job); 404 for a job they may not see."""
    return _job_change_view(request, pk, lambda job: job_cancel(job=job, by=request.user), "cancelled")


def _manageable_job(request: HttpRequest, pk: int) -> Job:
    """The job, if the user may see it (404 otherwise) and change it (403 otherwise)."""
    job = get_object_or_404(job_list(user=request.user), pk=pk)
    if not job_manageable(user=request.user).filter(pk=job.pk).exists():
        raise PermissionDenied("Only the job's owner or staff may change it.")
    return job


def _job_change_view(request: HttpRequest, pk: int, change: Callable[[Job], Job], done: str) -> HttpResponse:
    """Apply a job service to a job the user may see (404 otherwise); its refusal becomes a message."""
    job = _manageable_job(request, pk)
    try:
        change(job)
    except (JobStateError, PermissionDenied) as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Job {job.pk} {done}.")
    return redirect("web:job", pk=job.pk)


@require_POST
@login_required
def job_hold_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Hold a pending job (scontrol hold)."""
    return _job_change_view(request, pk, lambda job: job_hold(job=job, by=request.user), "held")


@require_POST
@login_required
def job_release_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Release a held job (scontrol release)."""
    return _job_change_view(request, pk, lambda job: job_release(job=job, by=request.user), "released")


@require_POST
@login_required
def job_update_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Change a job's time limit or its array's tasks at once (scontrol update); a refusal is a message."""
    form = JobLimitsForm(request.POST)
    if not form.is_valid():
        job = get_object_or_404(job_list(user=request.user), pk=pk)
        for field_errors in form.errors.values():
            for message in field_errors:
                messages.error(request, message)
        return redirect("web:job", pk=job.pk)
    limits = form.cleaned_data
    if limits["every_task"]:
        return _array_update_view(request, pk, limits)

    def change(job: Job) -> Job:
        try:
            return job_update(
                job=job,
                by=request.user,
                time_limit_s=limits["time_limit"],
                array_task_limit=limits["array_task_limit"],
            )
        except ValidationError as exc:
            raise JobStateError(" ".join(exc.messages)) from exc

    return _job_change_view(request, pk, change, "updated")


def _array_update_view(request: HttpRequest, pk: int, limits: dict[str, Any]) -> HttpResponse:
    """The job page's change of limits for every live task of the job's array: how many changed, and
    each refusal, as messages."""
    job = _manageable_job(request, pk)
    if job.array_job_id is None:
        messages.error(request, f"Job {job.pk} is not a task of an array.")
        return redirect("web:job", pk=job.pk)
    updated, refused = job_array_update(
        job=job,
        by=request.user,
        time_limit_s=limits["time_limit"],
        array_task_limit=limits["array_task_limit"],
    )
    if updated:
        messages.success(request, f"{len(updated)} tasks of array {job.array_job_id} updated.")
    for task_id, reason in refused.items():  # named once: the service's words may name it already
        messages.error(request, f"Job {task_id}: {reason.removeprefix(f'job {task_id}: ')}")
    return redirect("web:job", pk=job.pk)


@login_required
def cluster(request: HttpRequest) -> HttpResponse:
    """Every server: GPUs, cores and memory in use against capacity, state, last heartbeat."""
    return render(request, "web/cluster.html", {"overview": cluster_overview()})


def _server_change(
    request: HttpRequest, name: str, change: Callable[..., Any], **kwargs: Any
) -> HttpResponse:
    """Apply a node service (drain, resume) to the named server; its refusal becomes a message."""
    server = server_get_by_name(name=name)
    if server is None:
        raise Http404("no such server")
    try:
        server = change(server=server, **kwargs)
    except ServerStateError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Server {server.name} is {server.state}.")
    return redirect("web:cluster")


@require_POST
@staff_required
def server_drain(request: HttpRequest, name: str) -> HttpResponse:
    reason = request.POST.get("reason", "").strip()[:255]
    return _server_change(request, name, node_drain, reason=reason)


@require_POST
@staff_required
def server_resume(request: HttpRequest, name: str) -> HttpResponse:
    return _server_change(request, name, node_resume)
