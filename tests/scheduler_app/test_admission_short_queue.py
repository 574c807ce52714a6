"""Whether a submission's admission forecast runs in its request: at most N live jobs, counted exactly."""

import pytest

from scheduler_app.models import JobState
from scheduler_app.services.admission import _short_queue
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_the_queue_is_short_up_to_its_limit_and_counts_only_live_jobs():
    assert _short_queue(3)  # none
    JobFactory.create_batch(2)  # PENDING
    JobFactory(state=JobState.COMPLETED)
    assert _short_queue(3) and _short_queue(2) and not _short_queue(1)
    JobFactory(state=JobState.RUNNING)
    assert _short_queue(3) and not _short_queue(2)
    JobFactory()
    assert not _short_queue(3) and _short_queue(4)


def test_no_limit_means_never_short():
    assert not _short_queue(0)
