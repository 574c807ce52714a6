"""A signed-in user who is not staff opening a dashboard gets a 403 page and one log line, no traceback."""

from __future__ import annotations

import logging

import pytest
from django.urls import reverse

from tests.dashboards.test_views import ENDPOINTS, PAGES

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", PAGES + ENDPOINTS)
def test_a_refused_page_is_a_403_without_a_traceback(plain_client, caplog, name):
    with caplog.at_level(logging.DEBUG):
        response = plain_client.get(reverse(f"dashboards:{name}"))
    assert response.status_code == 403
    refused = [r for r in caplog.records if r.name == "django.request"]
    assert [r.getMessage() for r in refused] == [f"Forbidden: {reverse(f'dashboards:{name}')}"]
    assert not any(r.exc_info for r in caplog.records), [r.getMessage() for r in caplog.records if r.exc_info]
