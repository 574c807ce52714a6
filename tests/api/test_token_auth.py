"""The jobs endpoints' token check (one statement) answers as DRF's TokenAuthentication does."""

import pytest
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient, APIRequestFactory

from scheduler_app.api.token_auth import LeanTokenAuthentication
from scheduler_app.api.views import JobViewSet
from scheduler_app.services.api_tokens import api_token_rotate

pytestmark = pytest.mark.django_db


def outcome(cls, header: str):
    request = APIRequestFactory().get("/api/v1/jobs/", HTTP_AUTHORIZATION=header)
    try:
        found = cls().authenticate(request)
    except exceptions.AuthenticationFailed as exc:
        return ("refused", str(exc.detail))
    if found is None:
        return None
    user, token = found
    return (user.pk, user.username, user.is_staff, token.key, token.user_id, token.created)


def test_every_header_gets_drfs_answer(user):
    key = Token.objects.create(user=user).key
    headers = [f"Token {key}", "Token nope", "Token", f"Token {key} x", "Bearer abc", "", f"token {key}"]
    for header in headers:
        assert outcome(LeanTokenAuthentication, header) == outcome(TokenAuthentication, header), header
    assert outcome(LeanTokenAuthentication, f"Token {key}")[0] == user.pk
    user.is_active = False
    user.save()
    assert outcome(LeanTokenAuthentication, f"Token {key}") == ("refused", "User inactive or deleted.")
    assert outcome(TokenAuthentication, f"Token {key}") == ("refused", "User inactive or deleted.")


def test_the_jobs_endpoints_use_it_and_a_rotated_token_stops_at_once(user):
    assert LeanTokenAuthentication in JobViewSet.authentication_classes
    assert TokenAuthentication not in JobViewSet.authentication_classes
    old = Token.objects.create(user=user).key
    client = APIClient()
    assert client.get("/api/v1/jobs/", HTTP_AUTHORIZATION=f"Token {old}").status_code == 200
    api_token_rotate(user)
    refused = client.get("/api/v1/jobs/", HTTP_AUTHORIZATION=f"Token {old}")
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == "Token"
    assert refused.json() == {"detail": "Invalid token."}
