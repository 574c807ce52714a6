"""The home page, the health check and every admin page answer with the seeded demo cluster."""

import pytest
from django.contrib import admin
from django.core.management import call_command
from django.urls import reverse

from cluster_app.models import Gpu, Server
from profiles_app.models import Workload
from scheduler_app.models import Job, JobEvent, Team

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(db):
    call_command("seed_demo", verbosity=0)


def test_seed_demo_builds_the_synergy_testbed(demo):
    assert Server.objects.count() == 4
    assert {(s.num_gpus, s.num_cpus, s.mem_gb) for s in Server.objects.all()} == {(8, 24, 500.0)}
    assert Gpu.objects.count() == 32
    assert Workload.objects.count() == 12
    assert Workload.objects.get(name="res18").best_cpus_per_gpu == 9
    assert Team.objects.count() == 3
    assert Job.objects.filter(state="PENDING").count() == 6
    assert JobEvent.objects.filter(kind="submitted").count() == 6


def test_seed_demo_twice_changes_nothing(demo):
    call_command("seed_demo", verbosity=0)
    assert (Server.objects.count(), Gpu.objects.count(), Job.objects.count()) == (4, 32, 6)


def test_home_page_shows_the_cluster(client, demo):
    response = client.get("/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "gpu01" in body and "gpu04" in body
    assert '<span class="figure">32</span>' in body


def test_home_page_reads_the_heartbeats_in_one_query_whatever_the_servers(client, demo):
    # Heartbeats live in ServerHeartbeat (a round never locks them); the page lists them beside the
    # servers through a join, not a query per server.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from tests.factories import ServerFactory, heartbeat_at

    for server in Server.objects.all():
        heartbeat_at(server, timezone.now())
    with CaptureQueriesContext(connection) as four:
        assert client.get("/").status_code == 200
    for i in range(6):
        heartbeat_at(ServerFactory(name=f"extra{i}", with_gpus=False), timezone.now())
    with CaptureQueriesContext(connection) as ten:
        body = client.get("/").content.decode()
    assert "extra5" in body and "never" not in body
    assert len(ten.captured_queries) == len(four.captured_queries)


def test_every_admin_changelist_and_add_page_opens(client, demo, staff_user):
    client.force_login(staff_user)
    assert client.get("/admin/").status_code == 200
    for model in admin.site._registry:
        opts = model._meta
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        assert client.get(url).status_code == 200, url
        if admin.site._registry[model].has_add_permission(request=type("R", (), {"user": staff_user})()):
            add_url = reverse(f"admin:{opts.app_label}_{opts.model_name}_add")
            assert client.get(add_url).status_code == 200, add_url


def test_admin_shows_a_server_with_its_gpus(client, demo, staff_user):
    client.force_login(staff_user)
    server = Server.objects.get(name="gpu01")
    response = client.get(reverse("admin:cluster_app_server_change", args=[server.pk]))
    assert response.status_code == 200
    assert server.gpus.first().uuid in response.content.decode()


def test_the_embedded_mode_migrates_on_sqlite(tmp_path):
    """`make demo` runs on SQLite: every migration must apply there too (CI runs PostgreSQL only)."""
    import os
    import subprocess
    import sys

    from tests.standalone import ROOT

    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'embedded.sqlite3'}"
    result = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
