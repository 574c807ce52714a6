"""docker-compose.yml parses, follows the Compose specification's schema and defines the stack (no Docker
engine runs on CI machines)."""

import copy
import json
import os
import re
from importlib.resources import files
from pathlib import Path
from unittest import mock

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"


def load() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def compose_spec_validator() -> jsonschema.protocols.Validator:
    """The Compose specification's JSON schema (compose-spec/compose-spec, schema/compose-spec.json,
    Apache-2.0), as check-jsonschema ships it (requirements-dev.txt pins the version, hence the schema's)."""
    schema_file = files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)  # the draft it declares (2020-12 today)
    validator.check_schema(schema)
    return validator(schema, format_checker=validator.FORMAT_CHECKER)


def test_compose_file_follows_the_compose_specification():
    errors = sorted(compose_spec_validator().iter_errors(load()), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda c: c["services"]["web"].update(healthchek={"test": ["CMD", "true"]}),  # a misspelt key
        lambda c: c["services"]["web"].update(ports={"8000": 8000}),  # ports is a list
        lambda c: c["services"]["worker"].update(depends_on={"redis": {"condition": "healthy"}}),
    ],
)
def test_the_schema_check_catches_a_broken_compose_file(break_it):
    compose = copy.deepcopy(load())
    break_it(compose)
    assert list(compose_spec_validator().iter_errors(compose))


def test_compose_requires_env_and_the_secrets():
    """No .env, no start; SECRET_KEY and the database password come from it, never from a default here."""
    text = COMPOSE.read_text()
    for name in ("web", "worker", "forecasts-worker", "beat"):
        service = load()["services"][name]
        assert service["env_file"] == [{"path": ".env", "required": True}], name
        assert service["environment"]["SECRET_KEY"].startswith("${SECRET_KEY:?"), name
    assert load()["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(
        "${POSTGRES_PASSWORD:?"
    )
    assert not re.search(r"SECRET_KEY:-", text) and "POSTGRES_PASSWORD: attune" not in text
    # .env.example names both, with placeholders the service refuses (config/secret_key.py).
    example = (ROOT / ".env.example").read_text()
    assert re.search(r"^SECRET_KEY=change-me-to-a-long-random-string$", example, re.M)
    assert re.search(r"^POSTGRES_PASSWORD=", example, re.M)


def test_compose_defines_the_six_services():
    assert set(load()["services"]) == {"postgres", "redis", "web", "worker", "forecasts-worker", "beat"}


def test_infrastructure_and_web_have_health_checks():
    services = load()["services"]
    for name in ("postgres", "redis", "web", "worker", "forecasts-worker"):
        assert services[name]["healthcheck"]["test"], name


def test_forecasts_have_a_worker_of_their_own_and_rounds_stay_on_the_default_queue(settings):
    """Every queue a task is routed to has a worker consuming it; the rounds' worker consumes only the
    default queue, so a forecast never waits in front of a round."""
    services = load()["services"]
    forecasts = services["forecasts-worker"]["command"]
    # At a lower CPU priority than the web tier and the rounds: forecasts are background work.
    assert forecasts[:7] == ["nice", "-n", "10", "celery", "-A", "config", "worker"]
    assert forecasts[forecasts.index("-Q") + 1] == "forecasts"
    assert "-Q" not in services["worker"]["command"]
    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()}
    assert routed == {"forecasts"}
    assert "scheduler_app.tasks.scheduling_round_task" not in settings.CELERY_TASK_ROUTES


def test_app_services_share_env_and_wait_for_healthy_dependencies():
    services = load()["services"]
    for name in ("web", "worker", "forecasts-worker", "beat"):
        service = services[name]
        assert service["env_file"][0] == {"path": ".env", "required": True}
        assert service["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "redis": {"condition": "service_healthy"},
        }
    assert "gunicorn -c config/gunicorn.conf.py" in " ".join(services["web"]["command"])
    # A fresh deployment gets the workload catalog (and no demo users: seed_demo is nowhere).
    web = " ".join(services["web"]["command"])
    assert "migrate --noinput && python manage.py load_catalog && gunicorn" in web
    assert not any("seed_demo" in str(service.get("command")) for service in services.values())
    assert services["worker"]["command"][:4] == ["celery", "-A", "config", "worker"]
    assert services["beat"]["command"][:4] == ["celery", "-A", "config", "beat"]


def test_web_health_check_hits_a_real_route(client, db):
    assert client.get("/healthz").status_code == 200


def test_the_web_tier_config_serves_the_asgi_router_with_uvicorn_workers():
    """The image and compose run config/gunicorn.conf.py: the agents' long-poll exists only there."""
    path = ROOT / "config" / "gunicorn.conf.py"
    settings: dict = {"__file__": str(path)}  # as gunicorn loads it: a module with its file
    exec(compile(path.read_text(), str(path), "exec"), settings)
    assert settings["wsgi_app"] == "config.asgi:application"
    assert settings["worker_class"] == "uvicorn_worker.UvicornWorker"
    assert settings["keepalive"] > 10  # longer than an agent's sync interval


def test_the_web_tier_config_reads_the_servers_options_from_dot_env(tmp_path):
    """A deployment without Docker sets ATTUNE_BIND in .env (docs/deploy.md); the environment wins."""
    (tmp_path / "config").mkdir()
    path = tmp_path / "config" / "gunicorn.conf.py"
    path.write_text((ROOT / "config" / "gunicorn.conf.py").read_text())
    (tmp_path / ".env").write_text("ATTUNE_BIND=127.0.0.1:8321\nATTUNE_KEEPALIVE_S=42\n")
    environment = {k: v for k, v in os.environ.items() if k not in ("ATTUNE_BIND", "ATTUNE_KEEPALIVE_S")}
    with mock.patch.dict(os.environ, environment, clear=True):
        settings: dict = {"__file__": str(path)}
        exec(compile(path.read_text(), str(path), "exec"), settings)
        assert (settings["bind"], settings["keepalive"]) == ("127.0.0.1:8321", 42)
    with mock.patch.dict(os.environ, {**environment, "ATTUNE_BIND": "0.0.0.0:9000"}, clear=True):
        settings = {"__file__": str(path)}
        exec(compile(path.read_text(), str(path), "exec"), settings)
        assert settings["bind"] == "0.0.0.0:9000"
