"""docker-compose.yml parses and defines the stack (no Docker engine runs on CI machines)."""

from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parent.parent / "docker-compose.yml"


def load() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_defines_the_five_services():
    assert set(load()["services"]) == {"postgres", "redis", "web", "worker", "beat"}


def test_infrastructure_and_web_have_health_checks():
    services = load()["services"]
    for name in ("postgres", "redis", "web", "worker"):
        assert services[name]["healthcheck"]["test"], name


def test_app_services_share_env_and_wait_for_healthy_dependencies():
    services = load()["services"]
    for name in ("web", "worker", "beat"):
        service = services[name]
        assert service["env_file"][0]["path"] == ".env"
        assert service["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "redis": {"condition": "service_healthy"},
        }
    assert "gunicorn config.wsgi" in " ".join(services["web"]["command"])
    assert services["worker"]["command"][:4] == ["celery", "-A", "config", "worker"]
    assert services["beat"]["command"][:4] == ["celery", "-A", "config", "beat"]


def test_web_health_check_hits_a_real_route(client, db):
    assert client.get("/healthz").status_code == 200
