"""The sync bench's parts breakdown: an interval sync part by part, then whole, each timed alone."""

from __future__ import annotations

import json
import statistics
import time

from bench.sync_cost_measure import backend_cpu_clock
from bench.sync_cost_setup import SYNC, Agent


def parts_rows(agent: Agent, count: int) -> list[list]:
    """An interval sync with 4 progress reports (left to the applier) part by part, each timed alone,
    then the view without the middleware and the whole call, interleaved: `count` of each, medians of
    this process's CPU, the database backend's mean CPU per call. Where a sync's CPU goes without
    cProfile's own cost, which inflates the frameworks' many small functions several times over.
    The whole call three ways: the test client (Django's handler without its request signals), and as
    the image serves it from a WSGI environ, with Django's request signals (each request's connection
    health check, a `SELECT 1`, included): through Django's WSGI handler, and through the agents' path
    (config/agent_calls.py) that the image runs first. Each whole call includes the bench's own work
    (the body's JSON, the request built), timed alone in a row of its own."""
    from django.core.wsgi import get_wsgi_application
    from django.test import RequestFactory

    from cluster_app.agent_wake import wait_ticket, wake_generation
    from cluster_app.selectors import agent_credential_find
    from config.agent_calls import AgentCallsFirst
    from infra.prepared_sql import prepared_statements
    from scheduler_app.api.agent_checks import reports_check_fast, sync_body_check
    from scheduler_app.api.agent_views import REPORT_CHECKER, SYNC_CHECKER, AgentSyncView
    from scheduler_app.api.serializers.agents import AgentHeartbeatSerializer
    from scheduler_app.selectors import agent_commands
    from scheduler_app.services.agent_sync import PROGRESS_LOCK_WAIT_MS, SyncRequest
    from scheduler_app.services.agents import agent_heartbeat
    from scheduler_app.services.report_apply import LeaseReport
    from scheduler_app.services.report_ingest import agent_reports_ingest

    authorization = agent.client.defaults["HTTP_AUTHORIZATION"]
    token = authorization.split()[1]
    factory = RequestFactory(HTTP_AUTHORIZATION=authorization)
    view = AgentSyncView.as_view()
    backend_cpu_s = backend_cpu_clock()
    cpu: dict[str, list[float]] = {}
    db: dict[str, float] = {}

    def timed(label: str, call, *args, **kwargs):
        db_before = backend_cpu_s()
        start = time.process_time()
        result = call(*args, **kwargs)
        cpu.setdefault(label, []).append((time.process_time() - start) * 1000)
        db[label] = db.get(label, 0.0) + backend_cpu_s() - db_before
        return result

    def checked(data: dict) -> SyncRequest:
        body = sync_body_check(data, SYNC_CHECKER)
        reports, _ = reports_check_fast(body["reports"], checker=REPORT_CHECKER)
        usage = AgentHeartbeatSerializer.usage_of(body["sample"])
        valid = [LeaseReport(**report) for report in reports]
        return SyncRequest(usage=usage, running=body["running"], sizes=body["sizes"], reports=valid)

    def by_parts() -> None:
        sync = timed("the checks and the request's objects", checked, json.loads(agent.body(4)))
        with prepared_statements():
            server = timed("the credential and its server", lambda: agent_credential_find(token=token).server)
            server = timed("the heartbeat", agent_heartbeat, server=server, usage=sync.usage)
            timed("the reports stored", agent_reports_ingest, server=server, reports=sync.reports,
                  lock_wait_ms=PROGRESS_LOCK_WAIT_MS)  # fmt: skip
            timed("the wake generation (Redis)", wake_generation, server.pk)
            timed("the commands", agent_commands, server=server, running=sync.running, sizes=sync.sizes)
            timed("the wait ticket", wait_ticket, server.pk)

    def view_alone() -> None:
        request = factory.post(SYNC, data=agent.body(4), content_type="application/json")
        response = view(request)
        response.render()
        if response.status_code != 200:
            raise RuntimeError(f"sync answered {response.status_code}: {response.content[:500]!r}")

    django_wsgi = get_wsgi_application()
    agents_first = AgentCallsFirst(django_wsgi)

    def built() -> None:
        """What the bench itself spends on each whole call below: the body and the request (no service)."""
        factory.post(SYNC, data=agent.body(4), content_type="application/json")

    def served(app) -> None:
        """One sync as the WSGI server hands it to `app`, its answer read and closed as the server does."""
        environ = factory.post(SYNC, data=agent.body(4), content_type="application/json").environ
        status = []
        iterable = app(environ, lambda line, headers: status.append(line))
        answer = b"".join(iterable)
        iterable.close()
        if status != ["200 OK"]:
            raise RuntimeError(f"sync answered {status}: {answer[:500]!r}")

    parts = [
        "the checks and the request's objects",
        "the credential and its server",
        "the heartbeat",
        "the reports stored",
        "the wake generation (Redis)",
        "the commands",
        "the wait ticket",
    ]
    for round_ in range(count + 20):
        if round_ == 20:  # the first calls warm up the code paths and the prepared statements
            cpu.clear()
            db.clear()
        by_parts()
        timed("the view alone (DRF, no middleware)", view_alone)
        timed("the whole call (Django's handler)", lambda: agent.sync(4))
        timed("the bench's own: a body and its request built", built)
        timed("served: Django's WSGI handler", served, django_wsgi)
        timed("served: the agents' path first", served, agents_first)

    def row(label: str) -> list:
        return [label, f"{statistics.median(cpu[label]):.3f}", f"{db[label] * 1000 / count:.3f}"]

    rows = [row(label) for label in parts]
    total = sum(statistics.median(cpu[label]) for label in parts)
    rows.append(["the parts together", f"{total:.3f}", f"{sum(db[p] for p in parts) * 1000 / count:.3f}"])
    rows += [row("the view alone (DRF, no middleware)"), row("the whole call (Django's handler)")]
    rows += [row("the bench's own: a body and its request built")]
    rows += [row("served: Django's WSGI handler"), row("served: the agents' path first")]
    return rows
