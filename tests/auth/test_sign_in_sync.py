"""services.sign_in: a sign-in's groups set the mapped teams, the staff flags and the Unix account."""

from __future__ import annotations

import pytest

from scheduler_app.models import Team, UnixAccount
from scheduler_app.services.sign_in import SignInMapping, sign_in_sync
from tests.factories import UserFactory

MAPPING = SignInMapping(
    teams={"vision-lab": "vision", "nlp-lab": "nlp"},
    create_teams=True,
    staff_groups=frozenset({"hpc-admins"}),
    superuser_groups=frozenset(),
)

pytestmark = pytest.mark.django_db


def teams_of(user) -> list[str]:
    return sorted(user.attune_teams.values_list("name", flat=True))


def test_groups_put_the_user_in_their_teams_creating_missing_ones():
    user = UserFactory(username="alice")
    Team.objects.create(name="vision", gpu_quota=8)
    result = sign_in_sync(user, groups=["vision-lab", "nlp-lab", "unmapped"], mapping=MAPPING)
    assert teams_of(user) == ["nlp", "vision"]
    assert result.joined == ("nlp", "vision")
    assert Team.objects.get(name="vision").gpu_quota == 8  # an existing team is joined, not changed
    assert Team.objects.get(name="nlp").gpu_quota is None


def test_leaving_a_group_leaves_its_team_but_not_a_team_staff_manage_by_hand():
    user = UserFactory(username="alice")
    by_hand = Team.objects.create(name="interns")
    by_hand.members.add(user)
    sign_in_sync(user, groups=["vision-lab", "nlp-lab"], mapping=MAPPING)
    result = sign_in_sync(user, groups=["nlp-lab"], mapping=MAPPING)
    assert result.left == ("vision",)
    assert teams_of(user) == ["interns", "nlp"]


def test_without_team_creation_an_unknown_team_is_not_made():
    user = UserFactory(username="alice")
    mapping = SignInMapping(MAPPING.teams, False, MAPPING.staff_groups, frozenset())
    result = sign_in_sync(user, groups=["vision-lab"], mapping=mapping)
    assert result.joined == ()
    assert not Team.objects.filter(name="vision").exists()


def test_staff_groups_decide_is_staff_both_ways_and_are_left_alone_when_unset():
    user = UserFactory(username="bob")
    assert sign_in_sync(user, groups=["hpc-admins"], mapping=MAPPING).is_staff
    user.refresh_from_db()
    assert user.is_staff
    assert not sign_in_sync(user, groups=["nlp-lab"], mapping=MAPPING).is_staff
    user.refresh_from_db()
    assert not user.is_staff
    admin = UserFactory(username="root-admin", is_staff=True)
    no_staff_mapping = SignInMapping(MAPPING.teams, True, frozenset(), frozenset())
    sign_in_sync(admin, groups=[], mapping=no_staff_mapping)
    admin.refresh_from_db()
    assert admin.is_staff  # set by hand in the admin, no staff groups configured: kept


def test_superuser_group_makes_staff_too():
    user = UserFactory(username="carol")
    mapping = SignInMapping({}, True, frozenset(), frozenset({"wheel"}))
    result = sign_in_sync(user, groups=["wheel"], mapping=mapping)
    assert (result.is_staff, result.is_superuser) == (True, True)


def test_unix_account_defaults_to_the_directory_name_unless_staff_mapped_one():
    same = UserFactory(username="alice")
    assert sign_in_sync(same, groups=[], unix_name="alice", mapping=MAPPING).unix_user is None
    assert not UnixAccount.objects.filter(user=same).exists()  # jobs run as the username

    email_user = UserFactory(username="erin@lab.example")
    assert sign_in_sync(email_user, groups=[], unix_name="erin", mapping=MAPPING).unix_user == "erin"
    assert UnixAccount.objects.get(user=email_user).unix_user == "erin"

    mapped = UserFactory(username="frank@lab.example")
    UnixAccount.objects.create(user=mapped, unix_user="fjones")
    assert sign_in_sync(mapped, groups=[], unix_name="frank", mapping=MAPPING).unix_user == "fjones"


def test_an_unfit_unix_name_is_not_mapped():
    user = UserFactory(username="ops@lab.example")
    assert sign_in_sync(user, groups=[], unix_name="root", mapping=MAPPING).unix_user is None
    assert sign_in_sync(user, groups=[], unix_name="nobody", mapping=MAPPING).unix_user is None
    assert not UnixAccount.objects.filter(user=user).exists()
