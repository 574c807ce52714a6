"""Routes of sign-in, mounted by config/urls.py: the API token page, and OpenID Connect's two under /oidc/."""

from django.urls import path

from scheduler_app.web import sign_in_views

app_name = "sign_in"

urlpatterns = [
    path("account/token/", sign_in_views.api_token, name="api-token"),
]

# mozilla-django-oidc builds its redirect_uri from the callback's name (OIDC_AUTHENTICATION_CALLBACK_URL's
# default), so these keep the library's names, outside any namespace.
oidc_urlpatterns = [
    path("authenticate/", sign_in_views.oidc_start, name="oidc_authentication_init"),
    path("callback/", sign_in_views.oidc_callback, name="oidc_authentication_callback"),
]
