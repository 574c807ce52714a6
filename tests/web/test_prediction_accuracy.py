"""The job page's prediction accuracy: its own leases, its workload's and the GENIE fit's, per shape."""

from __future__ import annotations

import re

import pytest

from profiles_app.models import Workload
from tests.dashboards.test_prediction_accuracy import genie_fit, lease
from tests.factories import JobFactory, ServerFactory, UserFactory
from tests.web.conftest import pending_job

pytestmark = pytest.mark.django_db


def accuracy_section(html: str) -> str:
    match = re.search(r'<div id="job-prediction-accuracy" data-live>(.*?)\n</div>\s*<h2>Timeline', html, re.S)
    assert match, "no prediction accuracy section"
    return match.group(1)


def cells(section: str, shape: str) -> list[str]:
    """The texts of the row of `shape`, after its header cell."""
    row = re.search(rf'<th scope="row">{re.escape(shape)}</th>(.*?)</tr>', section, re.S)
    assert row, f"no row for {shape}"
    return re.findall(r"<td>(.*?)</td>", row.group(1))


def test_the_job_page_compares_its_leases_with_its_workloads_and_the_fit(user, client_of, cluster):
    res18 = Workload.objects.get(name="res18")
    server = ServerFactory(with_gpus=False)
    job = pending_job(user, workload=res18, num_gpus=2)
    # Its own: 2 GPUs on one server, 0.1 s -> 0.125 s (+25%), 0.1 s -> 0.15 s (+50%): medians 0.1 / 0.1375.
    lease(job, predicted=10, measured=8, server=server)
    lease(job, predicted=10, measured=1 / 0.15, server=server)
    # Another job of the workload on the same shape: 0.1 s -> 0.1 s (0%); on another shape: not shown.
    other = JobFactory(workload=res18, num_gpus=2)
    lease(other, predicted=10, measured=10, server=server)
    lease(JobFactory(workload=res18, num_gpus=1), predicted=1, measured=0.1, server=server)
    # At profiling: on 2 GPUs of one server 0.08 s -> 0.1 s (+25%).
    genie_fit(res18, [("n1k1b32", 0.05, 0.05), ("n1k1b64", 0.09, 0.1), ("n1k2b32", 0.08, 0.1)])

    section = accuracy_section(client_of(user).get(f"/jobs/{job.pk}/").content.decode())

    assert cells(section, "2 GPUs, 1 server") == [
        *["2", "100 ms", "138 ms", "+37.5%"],  # this job: 2 leases
        *["3", "100 ms", "125 ms", "+25.0%"],  # all res18 leases on the shape: 3
        *["1", "80 ms", "100 ms", "+25.0%"],  # at profiling: 1 sample
    ]
    assert "1 GPU" not in section
    assert "newest 3 leases on these shapes" in section and "GENIE fit of" in section


def test_without_a_fit_the_page_says_so_and_shows_no_profiling_columns(user, client_of, cluster):
    job = pending_job(user, num_gpus=1)
    lease(job, predicted=4, measured=5)  # 0.25 s -> 0.2 s (-20%)

    section = accuracy_section(client_of(user).get(f"/jobs/{job.pk}/").content.decode())

    assert cells(section, "1 GPU") == ["1", "250 ms", "200 ms", "-20.0%", "1", "250 ms", "200 ms", "-20.0%"]
    assert "At profiling" not in section and "has no GENIE fit yet" in section


def test_a_job_without_reports_says_so_in_one_line(user, client_of, cluster):
    job = pending_job(user)
    section = accuracy_section(client_of(user).get(f"/jobs/{job.pk}/").content.decode())
    assert section.strip() == (
        '<p class="empty">No lease of this job has reported its speed yet: '
        "nothing to compare with the prediction.</p>"
    )


def test_an_own_command_job_says_there_is_no_prediction(user, client_of, cluster):
    job = pending_job(UserFactory(), command="echo hi", workload=None, time_limit_s=600)
    section = accuracy_section(client_of(user).get(f"/jobs/{job.pk}/").content.decode())
    assert "runs its own command: there is no workload prediction to compare with" in section
