"""The deployment files, checked without a container engine: compose.yaml (services, start
order, environment, health checks), the Dockerfile it builds, and the systemd unit."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
import yaml
from support import ROOT
from typer.main import get_command

from worker.api.app import create_app
from worker.cli import app as cli_app
from worker.settings import Settings

# Seconds a stopping worker may need beyond WORKER_SHUTDOWN_GRACE: cancelling what still runs,
# writing the last outcomes, handing jobs back and deregistering. Usually well under a second.
MIN_MARGIN, MAX_MARGIN = 5, 60
VARIABLE = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


def resolve(text: str) -> str:
    """`${VAR:-default}` as compose resolves it with nothing set (required ones: a marker)."""
    return VARIABLE.sub(lambda m: m.group(3) if m.group(2) in ("-", ":-") else "<required>", text)


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", duration)
    assert match, f"not a compose duration: {duration}"
    return float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[match.group(2)]


def default_grace() -> float:
    return float(Settings.model_fields["shutdown_grace"].default)


def test_stack_has_postgres_migrations_workers_and_the_api(services):
    assert set(services) == {"postgres", "migrate", "worker", "api"}


def test_postgres_is_health_checked_and_keeps_its_data(compose, services):
    pg = services["postgres"]
    assert pg["image"].startswith("postgres:")
    test = pg["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL" and "pg_isready" in test[1]
    assert seconds(pg["healthcheck"]["interval"]) <= 10 and pg["healthcheck"]["retries"] >= 3
    assert "pgdata:/var/lib/postgresql/data" in pg["volumes"] and "pgdata" in compose["volumes"]
    assert set(pg["environment"]) == {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"}


def test_migrations_run_once_after_postgres_is_healthy(services):
    migrate = services["migrate"]
    assert migrate["command"] == ["migrate"]
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert migrate["restart"] == "no"


@pytest.mark.parametrize("name", ["worker", "api"])
def test_workers_and_api_start_after_migrations_against_the_postgres_service(services, name):
    service = services[name]
    assert service["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
    }
    assert service["build"] == "." and service["env_file"] == [{"path": ".env", "required": False}]
    url = resolve(service["environment"]["DATABASE_URL"])
    assert url == "postgresql://worker:worker@postgres:5432/worker"
    pg_env = {k: resolve(v) for k, v in services["postgres"]["environment"].items()}
    assert url == (
        f"postgresql://{pg_env['POSTGRES_USER']}:{pg_env['POSTGRES_PASSWORD']}"
        f"@postgres:5432/{pg_env['POSTGRES_DB']}"
    )
    assert Settings(DATABASE_URL=url).database_url == url  # the worker accepts it


def test_workers_scale_without_clashing_and_stop_gracefully(services):
    worker = services["worker"]
    assert "container_name" not in worker and "ports" not in worker
    command = resolve(worker["command"]).split()
    assert command[0] == "run" and command[1:] == ["worker.demo"]
    assert worker["stop_signal"] == "SIGTERM"
    margin = seconds(worker["stop_grace_period"]) - default_grace()
    assert MIN_MARGIN <= margin <= MAX_MARGIN
    port = resolve(worker["environment"]["WORKER_METRICS_PORT"])
    assert [resolve(str(p)) for p in worker["expose"]] == [port]
    probe = " ".join(worker["healthcheck"]["test"])
    assert "/metrics" in probe and "WORKER_METRICS_PORT" in probe


def test_api_listens_on_all_interfaces_with_a_token_and_a_real_health_route(services):
    api = services["api"]
    command = api["command"]
    assert command[0] == "api"
    port = command[command.index("--port") + 1]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert [resolve(p) for p in api["ports"]] == [f"8000:{port}"]
    assert ":?" in api["environment"]["WORKER_API_TOKEN"]  # compose refuses to start without
    probe = " ".join(api["healthcheck"]["test"])
    path = re.search(rf"127\.0\.0\.1:{port}(/\w+)", probe)
    assert path is not None
    routes = {
        getattr(r, "path", None) for r in create_app("postgresql://x@127.0.0.1:9/x", "t").routes
    }
    assert path.group(1) in routes


def test_every_variable_the_stack_reads_is_a_real_setting_or_a_compose_one():
    names = {m.group(1) for m in VARIABLE.finditer((ROOT / "compose.yaml").read_text())}
    aliases = {f.alias for f in Settings.model_fields.values()}
    compose_own = {
        "POSTGRES_USER",
        "POSTGRES_PASSWORD",
        "POSTGRES_DB",
        "WORKER_IMAGE",
        "WORKER_TASK_MODULES",
        "API_PORT",
    }
    assert names - compose_own <= aliases, names - compose_own - aliases


def test_the_image_runs_the_worker_program_the_services_call():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["worker"]' in dockerfile
    copied = [
        word
        for line in dockerfile.splitlines()
        if line.startswith("COPY ")
        for word in line.split()[1:-1]
    ]
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["readme"]
    assert readme in copied  # pip needs it to install the package
    assert {"pyproject.toml", "worker", "migrations", "alembic.ini"} <= set(copied)
    assert all((ROOT / source).exists() for source in copied if source != readme)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".env" in ignored and ".venv" in ignored  # no secrets, no local venv in the image
    commands = set(get_command(cli_app).commands)  # type: ignore[attr-defined]
    for name, service in yaml.safe_load((ROOT / "compose.yaml").read_text())["services"].items():
        if "build" in service:
            command = service["command"]
            verb = command[0] if isinstance(command, list) else command.split()[0]
            assert verb in commands, (name, verb)


# -- systemd -----------------------------------------------------------------------------------


def unit() -> dict[str, list[tuple[str, str]]]:
    """The unit file's sections as (key, value) lists (keys such as Environment repeat)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for raw in (ROOT / "deploy" / "durable-worker.service").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        else:
            key, value = line.split("=", 1)
            current.append((key.strip(), value.strip()))
    return sections


def test_systemd_unit_restarts_on_failure_and_waits_out_the_shutdown_grace():
    entries = unit()["Service"]
    service = dict(entries)
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed"  # SIGTERM to the worker alone, SIGKILL to all at the end
    environment = dict(value.split("=", 1) for key, value in entries if key == "Environment")
    assert float(environment["WORKER_SHUTDOWN_GRACE"]) == default_grace()
    margin = float(service["TimeoutStopSec"]) - default_grace()
    assert MIN_MARGIN <= margin <= MAX_MARGIN
    program, verb = service["ExecStart"].split()[:2]
    assert program.endswith("/worker") and verb == "run"
    assert service["RestartPreventExitStatus"] == "2"  # a bad setting: restarting cannot help
    assert dict(unit()["Install"])["WantedBy"] == "multi-user.target"


def test_systemd_unit_and_compose_give_workers_the_same_stop_time(services):
    stop = dict(unit()["Service"])["TimeoutStopSec"]
    assert float(stop) == seconds(services["worker"]["stop_grace_period"])
