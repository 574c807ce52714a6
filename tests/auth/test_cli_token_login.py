"""`attune login` without a password: the token from the web page, given with --token or pasted at the
prompt, is checked against the service and saved; a wrong one is refused and not saved."""

from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token

from cli.config import resolve
from cli.main import main
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(transactional_db) -> str:
    return Token.objects.create(user=UserFactory(username="erin")).key


def test_login_with_the_token_flag_saves_it(live_server, token, token_file, capsys):
    assert main(["--server", live_server.url, "login", "--token", token]) == 0
    assert "Logged in" in capsys.readouterr().out
    assert resolve(server=None, token=None).token == token
    assert main(["queue"]) == 0  # the saved server and token serve the next command


def test_login_prompts_for_the_token_when_none_is_given(live_server, token, token_file, capsys, monkeypatch):
    prompts = []
    monkeypatch.setattr("getpass.getpass", lambda prompt: prompts.append(prompt) or f" {token}\n")
    assert main(["--server", live_server.url, "login"]) == 0
    assert prompts == ["Paste the token: "]
    assert f"{live_server.url}/account/token/" in capsys.readouterr().err
    assert resolve(server=None, token=None).token == token


def test_a_wrong_token_is_refused_and_not_saved(live_server, token, token_file, capsys):
    assert main(["--server", live_server.url, "login", "--token", "0" * 40]) == 1
    assert "not saved" in capsys.readouterr().err
    assert not token_file.exists()


def test_a_local_password_still_logs_in(live_server, token_file, capsys, monkeypatch, transactional_db):
    UserFactory(username="frank")
    monkeypatch.setenv("ATTUNE_PASSWORD", "pw-for-tests")
    assert main(["--server", live_server.url, "login", "--username", "frank"]) == 0
    assert "as frank" in capsys.readouterr().out
