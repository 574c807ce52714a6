"""With the Content-Security-Policy on (the default unless DEBUG), the pages, the dashboards' Plotly charts,
Swagger UI and the admin work in a real browser, and the browser reports no violation."""

from __future__ import annotations

from django.urls import reverse
from playwright.sync_api import expect

from tests.browser.test_dashboards import ALL_CHARTS_DRAWN, quiet_scheduler  # noqa: F401 (fixture)
from tests.dashboards.test_views import seed_a_little


def csp_of(response) -> str:
    policy = response.headers.get("content-security-policy", "")
    assert "script-src 'self'" in policy and "default-src 'self'" in policy, policy
    return policy


def test_the_user_pages_and_a_dashboards_charts_under_the_csp(
    browser_page,
    live_server,
    login,
    staff_user,
    quiet_scheduler,  # noqa: F811
):
    seed_a_little()
    page = login(browser_page, live_server, staff_user)
    for url in ("/jobs/", "/jobs/new/", "/cluster/", "/accounting/", reverse("dashboards:utilisation")):
        csp_of(page.goto(f"{live_server.url}{url}"))
    page.wait_for_function(ALL_CHARTS_DRAWN)  # Plotly drew every chart of the last one
    assert page.locator(".chart[data-endpoint] .main-svg").count() > 0
    assert page.console_errors == []


def test_swagger_ui_and_the_admin_under_the_csp(browser_page, live_server, login, staff_user):
    page = login(browser_page, live_server, staff_user)
    csp_of(page.goto(f"{live_server.url}/api/docs/"))
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Attune API")
    expect(page.locator(".opblock").first).to_be_visible()
    assert page.console_errors == []
    for url in ("/admin/", "/admin/scheduler_app/job/", "/admin/auth/user/add/"):
        csp_of(page.goto(f"{live_server.url}{url}"))
    # The admin links no favicon, so the browser asks for /favicon.ico (a 404); nothing else may fail.
    assert [e for e in page.console_errors if "status of 404" not in e] == []
