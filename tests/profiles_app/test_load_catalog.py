"""`manage.py load_catalog`: the shipped catalog for a real deployment, idempotent, and nothing else."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from cluster_app.models import Server
from profiles_app.catalog import load_catalog
from profiles_app.models import Workload
from profiles_app.services.workloads import workload_register
from scheduler_app.models import Job, Team

pytestmark = pytest.mark.django_db


def load() -> str:
    out = StringIO()
    call_command("load_catalog", stdout=out)
    return out.getvalue()


def snapshot() -> dict[str, dict]:
    return {w["name"]: w for w in Workload.objects.values()}


def test_it_loads_every_model_and_creates_no_user_server_team_or_job():
    assert "12 models: 12 created, 0 updated, 0 unchanged, 0 kept" in load()
    assert set(Workload.objects.values_list("name", flat=True)) == set(load_catalog())
    assert Workload.objects.get(name="res18").best_cpus_per_gpu == 9
    assert not get_user_model().objects.exists()
    assert not (Server.objects.exists() or Team.objects.exists() or Job.objects.exists())


def test_running_it_twice_changes_nothing_not_even_the_rows_update_times():
    load()
    before = snapshot()
    assert "0 created, 0 updated, 12 unchanged" in load()
    assert snapshot() == before


def test_an_entry_shipped_differently_before_is_updated_and_what_this_cluster_learnt_is_kept():
    load()
    # An older release shipped other figures for lstm; res18's jobs taught a speed correction and a
    # penalty; vae was profiled on this cluster; gnmt's penalty was shipped and stays as shipped.
    Workload.objects.filter(name="lstm").update(iter_time_s=9.0, speedup=1.0)
    Workload.objects.filter(name="res18").update(
        speed_correction=0.8, speed_correction_jobs=5, placement_penalty=1.7, placement_penalty_leases=9
    )
    Workload.objects.filter(name="vae").update(source="profiled on gpu01 (run 3)", iter_time_s=0.42)
    shipped = load_catalog()
    assert "0 created, 1 updated, 10 unchanged, 1 kept" in load()
    lstm, res18, vae = (Workload.objects.get(name=n) for n in ("lstm", "res18", "vae"))
    assert (lstm.iter_time_s, lstm.speedup) == (shipped["lstm"].iter_time_s, shipped["lstm"].speedup)
    assert (res18.speed_correction, res18.speed_correction_jobs) == (0.8, 5)
    assert (res18.placement_penalty, res18.placement_penalty_leases) == (1.7, 9)
    assert (vae.source, vae.iter_time_s) == ("profiled on gpu01 (run 3)", 0.42)


def test_a_workload_registered_here_under_a_catalog_name_keeps_its_own_profile():
    workload_register(name="bert", argv=["python", "train_bert.py"])
    assert "11 created, 0 updated, 0 unchanged, 1 kept" in load()
    assert Workload.objects.get(name="bert").argv == ["python", "train_bert.py"]


def test_an_unknown_profile_set_is_refused_with_the_valid_ones():
    with pytest.raises(CommandError, match="unknown profile set 'nope'; valid: "):
        call_command("load_catalog", profile_set="nope")
    assert not Workload.objects.exists()
