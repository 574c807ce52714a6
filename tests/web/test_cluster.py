"""The cluster page: capacity against use per server, and staff-only drain and resume."""

from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from cluster_app.models import NodeState, ServerHeartbeat
from tests.web.conftest import running_job

pytestmark = pytest.mark.django_db


def test_every_server_with_use_against_capacity(user, client_of, cluster):
    running_job(user, cluster, gpus=2)
    html = client_of(user).get("/cluster/").content.decode()
    row = html.split('<tr id="server-gpu01"')[1].split("</tr>")[0]
    assert "2 / 4" in row and "6 / 12" in row and "125 / 250" in row
    assert "never" in row  # no heartbeat yet
    assert "Drain" not in html  # not staff


def test_the_overview_and_the_cluster_page_say_a_heartbeat_alike(user, client_of, cluster, settings):
    settings.TIME_ZONE = "Europe/Stockholm"  # the service's zone, as every time the pages show
    at = timezone.now() - timedelta(minutes=3)
    ServerHeartbeat.objects.create(server=cluster, at=at)
    local = at.astimezone(ZoneInfo("Europe/Stockholm"))
    said = f'{local:%Y-%m-%d %H:%M:%S}</time><br><small class="muted">3\xa0minutes ago</small>'
    client = client_of(user)
    overview = client.get("/").content.decode()
    assert said in overview.split('aria-label="Servers"')[1]  # not Django's "Dec. 1, 2026, 1:47 a.m."
    assert said in client.get("/cluster/").content.decode().split('<tr id="server-gpu01"')[1]


def test_staff_drain_and_resume(staff_user, client_of, cluster):
    client = client_of(staff_user)
    assert 'action="/cluster/servers/gpu01/drain/"' in client.get("/cluster/").content.decode()
    html = client.post("/cluster/servers/gpu01/drain/", {"reason": "new PSU"}, follow=True).content.decode()
    cluster.refresh_from_db()
    assert (cluster.state, cluster.state_reason) == (NodeState.DRAINED, "new PSU")
    assert "Server gpu01 is DRAINED." in html and 'action="/cluster/servers/gpu01/resume/"' in html
    client.post("/cluster/servers/gpu01/resume/")
    cluster.refresh_from_db()
    assert cluster.state == NodeState.IDLE


def test_resuming_a_live_server_changes_nothing_and_a_down_one_is_refused(staff_user, client_of, cluster):
    client = client_of(staff_user)
    client.post("/cluster/servers/gpu01/resume/")
    cluster.refresh_from_db()
    assert cluster.state == NodeState.IDLE
    cluster.state = NodeState.DOWN
    cluster.save()
    html = client.post("/cluster/servers/gpu01/drain/", follow=True).content.decode()
    assert "only a live server can be drained" in html
    assert client.post("/cluster/servers/nosuch/drain/").status_code == 404


def test_users_may_not_drain_or_resume(user, client_of, cluster):
    client = client_of(user)
    assert client.post("/cluster/servers/gpu01/drain/").status_code == 403
    assert client.post("/cluster/servers/gpu01/resume/").status_code == 403
    assert client.get("/cluster/servers/gpu01/drain/").status_code == 405
    cluster.refresh_from_db()
    assert cluster.state == NodeState.IDLE
