"""Users' jobs never run as the agents' catalog account or a system account: refused at submission."""

from __future__ import annotations

import pwd

import pytest

from scheduler_app.admin import UnixAccountForm
from scheduler_app.job_accounts import JobAccountsConf, run_as_problem
from scheduler_app.models import Job, UnixAccount
from tests.api.helpers import make_server
from tests.api.test_job_identity_api import post
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def scheduler(fifo_tune):
    pass


@pytest.fixture
def two_servers():
    return [make_server(f"gpu0{i}", gpus=4, cpus=12, mem_gb=250) for i in (1, 2)]


@pytest.mark.parametrize("name", ["postgres", "nobody", "www-data", "daemon"])
def test_a_web_user_named_like_a_system_account_cannot_submit_own_commands(two_servers, name):
    answer = post(UserFactory(username=name), name="probe", num_gpus=1, command="ls /var/lib/postgresql")
    assert answer.status_code == 400
    message = str(answer.json()["run_as"])
    assert f"“{name}” is" in message and "users' jobs never run as" in message
    assert "Ask staff to set the Unix account your jobs run as." in message
    assert not Job.objects.exists()


def test_the_catalog_account_is_the_services_setting(two_servers, settings):
    settings.ATTUNE_JOB_ACCOUNTS = {**settings.ATTUNE_JOB_ACCOUNTS, "agent_job_user": "attune-jobs"}
    answer = post(UserFactory(username="attune-jobs"), name="x", num_gpus=1, command="true")
    assert answer.status_code == 400
    assert "the account the nodes run catalog workloads as" in str(answer.json()["run_as"])
    assert not Job.objects.exists()


def test_a_staff_mapping_to_a_system_account_is_refused_too(two_servers):
    user = UserFactory(username="eve")
    form = UnixAccountForm(data={"user": user.pk, "unix_user": "postgres"})
    assert not form.is_valid() and "system account" in str(form.errors["unix_user"])
    # A mapping stored before this check (or by hand) is refused at submission all the same.
    UnixAccount.objects.create(user=user, unix_user="nobody")
    answer = post(user, name="x", num_gpus=1, command="true")
    assert answer.status_code == 400 and "catalog workloads" in str(answer.json()["run_as"])


def test_an_ordinary_account_is_accepted(two_servers):
    answer = post(UserFactory(username="alice"), name="x", num_gpus=1, command="true")
    assert answer.status_code == 201, answer.content
    assert Job.objects.get().run_as == "alice"


def test_a_uid_below_the_minimum_where_this_host_knows_the_account():
    conf = JobAccountsConf(agent_job_user="nobody", min_uid=1000, reserved=frozenset())

    def passwd(uid: int):
        return lambda name: pwd.struct_passwd((name, "x", uid, uid, "", f"/home/{name}", "/bin/sh"))

    assert "uid 101, below 1000" in run_as_problem("pgsql", conf=conf, getpwnam=passwd(101))
    assert run_as_problem("alice", conf=conf, getpwnam=passwd(1001)) is None

    def unknown(name):
        raise KeyError(name)

    assert run_as_problem("alice", conf=conf, getpwnam=unknown) is None  # the nodes decide by uid
    assert "never run as root" in run_as_problem("root", conf=conf, getpwnam=unknown)
