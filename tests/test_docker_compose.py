"""docker-compose.yml parses and defines the stack (no Docker engine runs on CI machines)."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"


def load() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


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
        assert service["env_file"][0]["path"] == ".env"
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
    settings: dict = {}
    exec(compile((ROOT / "config" / "gunicorn.conf.py").read_text(), "gunicorn.conf.py", "exec"), settings)
    assert settings["wsgi_app"] == "config.asgi:application"
    assert settings["worker_class"] == "uvicorn_worker.UvicornWorker"
    assert settings["keepalive"] > 10  # longer than an agent's sync interval
