"""The user pages in a real browser: log in, submit, queue, job page, cancel, logout, drain/resume."""

import re

from playwright.sync_api import expect

from cluster_app.models import NodeState
from scheduler_app.models import Job, JobState
from scheduler_app.services.rounds import scheduling_round_run


def test_submit_see_it_queued_open_it_and_cancel_it(browser_page, live_server, login, user, cluster):
    page = login(browser_page, live_server, user)
    page.get_by_role("link", name="Submit", exact=True).click()
    expect(page.get_by_role("heading", name="Submit a job")).to_be_visible()
    page.get_by_label("Job name").fill("resnet-a")
    page.get_by_label("Catalog workload").select_option("res18")
    page.get_by_label("GPUs").fill("2")
    page.get_by_label("Total iterations").fill("20000")
    page.get_by_label("Maximum latency").fill("2h")  # the command line's durations (cli/durations.py)
    page.get_by_role("button", name="Submit job").click()

    job = Job.objects.get(name="resnet-a")
    expect(page).to_have_url(f"{live_server.url}/jobs/{job.pk}/")
    expect(page.get_by_role("status")).to_contain_text(f"Job {job.pk} (resnet-a) submitted.")
    expect(page.locator("#job-state")).to_have_text("PENDING")
    # The admission prediction stored at submission: start, finish, and the QoS verdict.
    expect(page.locator("#estimated-start time")).to_be_visible()
    expect(page.locator("#predicted-at-submission time").nth(1)).to_be_visible()
    # A 2 h target for a job predicted to take longer: accepted, and said plainly (amber) at submission.
    expect(page.locator("#qos-attainable")).to_contain_text("at risk: predicted to finish after its target")
    expect(page.locator(".messages li.warning")).to_contain_text("Its QoS target is at risk")
    expect(page.locator("#schedule")).to_contain_text("Priority")

    page.get_by_role("link", name="Queue", exact=True).click()
    row = page.locator(f"#job-{job.pk}")
    expect(row).to_contain_text("resnet-a")
    expect(row).to_contain_text("PENDING")
    expect(row.locator("td").nth(5)).to_have_text("1")  # position (after the User column every user now sees)

    # A round places it: the queue and the job page show its allocation.
    scheduling_round_run(trigger="test")
    page.reload()
    expect(row).to_contain_text("RUNNING")
    expect(row).to_contain_text("gpu01")
    row.get_by_role("link", name="resnet-a").click()
    expect(page.locator("#job-state")).to_have_text("RUNNING")
    expect(page.get_by_role("table", name="Allocations")).to_contain_text("gpu01")
    expect(page.get_by_role("list", name="Events")).to_contain_text("submitted")

    page.get_by_role("button", name="Cancel job").click()
    expect(page.locator("#job-state")).to_have_text("CANCELLED")
    expect(page.get_by_role("status")).to_contain_text(f"Job {job.pk} cancelled.")
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert page.console_errors == []


def test_a_bad_submission_shows_the_error_by_its_field_and_keeps_the_input(
    browser_page, live_server, login, user, cluster
):
    page = login(browser_page, live_server, user)
    page.goto(f"{live_server.url}/jobs/new/")
    page.get_by_label("Job name").fill("too-big")
    page.get_by_label("Catalog workload").select_option("res18")
    page.get_by_label("GPUs").fill("64")
    page.get_by_label("Total iterations").fill("1234")
    page.get_by_label("Memory per GPU (GB)").fill("40")
    page.get_by_role("button", name="Submit job").click()

    expect(page.locator("#field-num_gpus .errorlist")).to_have_text("The cluster has only 4 GPUs.")
    expect(page.get_by_label("GPUs")).to_have_attribute("aria-invalid", "true")
    expect(page.locator(".errorlist")).to_have_count(1)
    expect(page.get_by_label("Job name")).to_have_value("too-big")
    expect(page.get_by_label("Catalog workload")).to_have_value("res18")
    expect(page.get_by_label("GPUs")).to_have_value("64")
    expect(page.get_by_label("Total iterations")).to_have_value("1234")
    expect(page.get_by_label("Memory per GPU (GB)")).to_have_value("40")
    assert not Job.objects.exists()
    assert page.console_errors == []


def test_a_wrong_password_then_login_and_logout(browser_page, live_server, login, user):
    page = browser_page
    page.goto(f"{live_server.url}/jobs/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/jobs/$"))
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill("wrong")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("correct username and password")
    expect(page.get_by_label("Username")).to_have_value(user.username)

    login(page, live_server, user)
    expect(page.locator(".username")).to_have_text(user.username)
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(f"{live_server.url}/accounts/login/")
    page.goto(f"{live_server.url}/jobs/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))
    assert page.console_errors == []


def test_staff_drain_and_resume_a_server(browser_page, live_server, login, staff_user, user, cluster):
    page = login(browser_page, live_server, staff_user)
    page.get_by_role("link", name="Cluster", exact=True).click()
    row = page.locator("#server-gpu01")
    expect(row).to_contain_text("IDLE")
    row.get_by_label("Reason to drain gpu01").fill("firmware update")
    row.get_by_role("button", name="Drain").click()
    expect(page.get_by_role("status")).to_contain_text("Server gpu01 is DRAINED.")
    expect(row).to_contain_text("DRAINED")
    expect(row).to_contain_text("firmware update")
    cluster.refresh_from_db()
    assert cluster.state == NodeState.DRAINED

    row.get_by_role("button", name="Resume").click()
    expect(row).to_contain_text("IDLE")
    cluster.refresh_from_db()
    assert cluster.state == NodeState.IDLE
    assert page.console_errors == []


def test_users_get_no_maintenance_buttons(browser_page, live_server, login, user, cluster):
    page = login(browser_page, live_server, user)
    page.goto(f"{live_server.url}/cluster/")
    expect(page.locator("#server-gpu01")).to_contain_text("IDLE")
    expect(page.get_by_role("button", name="Drain")).to_have_count(0)
    expect(page.get_by_role("link", name="Admin")).to_have_count(0)
    assert page.console_errors == []


def test_the_page_fixture_records_console_and_page_errors(browser_page, live_server):
    page = browser_page
    page.goto(f"{live_server.url}/accounts/login/")
    assert page.console_errors == []
    page.evaluate("console.error('boom')")
    page.evaluate("setTimeout(() => { throw new Error('bang'); }, 0)")
    page.wait_for_timeout(200)
    assert page.console_errors[0] == "boom" and "bang" in page.console_errors[1]


def test_a_batch_script_pasted_into_the_form_takes_its_directives(browser_page, live_server, login, cluster):
    from tests.factories import UserFactory

    page = login(browser_page, live_server, UserFactory(username="paula"))
    page.get_by_role("link", name="Submit", exact=True).click()
    # A malformed directive is shown next to the script, naming its line; nothing is stored.
    page.get_by_label("Or a batch script").fill("#!/bin/bash\n#SBATCH --job-name=x\n#SBATCH --mem=4G\nrun\n")
    page.get_by_role("button", name="Submit job").click()
    expect(page.locator("#submit-form")).to_contain_text("line 3: #SBATCH --mem=4G")
    assert not Job.objects.exists()

    page.get_by_label("Or a batch script").fill("#!/bin/bash\n#SBATCH --job-name=from-script --gpus=2\nrun\n")
    page.get_by_label("Time limit").fill("1:00:00")
    page.get_by_role("button", name="Submit job").click()
    job = Job.objects.get(name="from-script")
    expect(page).to_have_url(f"{live_server.url}/jobs/{job.pk}/")
    assert (job.num_gpus, job.time_limit_s, job.run_as, job.total_iters) == (2, 3600, "paula", None)
    assert "\r" not in job.script  # the textarea's CRLF line endings are not bash's
    expect(page.locator("#job-script")).to_contain_text("#SBATCH --job-name=from-script")
