"""The collector held off for a round (services/gc_pause.py) and back on after it, also on error."""

import gc

import pytest

from scheduler_app.models import JobState
from scheduler_app.services import rounds
from scheduler_app.services.gc_pause import gc_paused
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import make_server, submit


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_is_off_within_and_back_on_after_also_on_error(collector_on):
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: still off, and the inner one does not turn it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("a failed round")
    assert gc.isenabled()


def test_a_pause_within_a_disabled_collector_leaves_it_disabled(collector_on):
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


@pytest.mark.django_db
def test_a_round_decides_with_the_collector_off_and_back_on_after(user, fifo_tune, monkeypatch, collector_on):
    make_server("n1")
    job = submit(user, gpus=2)
    seen = []
    real = rounds.schedule_round

    def schedule_round(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(rounds, "schedule_round", schedule_round)
    assert scheduling_round_run(trigger="test").num_placed == 1
    job.refresh_from_db()
    assert seen == [False] and gc.isenabled() and job.state == JobState.RUNNING

    def failing(*args, **kwargs):
        raise RuntimeError("a bug in the core")

    monkeypatch.setattr(rounds, "schedule_round", failing)
    with pytest.raises(RuntimeError):
        scheduling_round_run(trigger="test")
    assert gc.isenabled()
