"""The `monitoring` profile's Prometheus (docker-compose.yml's `prometheus`, deploy/monitoring/prometheus.yml) run on
this host with Debian's prometheus, as Docker would run it, for the tests that check what it scrapes.

What Docker would provide is stood in for, and nothing more: the service's command runs as written (its shell writes
the page's token to a file and starts Prometheus), with its container paths (the mounted configuration, the data
volume, the token file, the binary) made this test's; the targets Docker's DNS would give for a service name are
the addresses its containers have here (127.0.0.1 and a port each); the listen address is a free port. One change
is not Docker's: scrapes come every second rather than every 15 s, so a test need not wait for the first one.
"""
from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.deploy.compose_on_host import load_compose, mounted
from tests.deploy.services import ROOT, Service, clean_env, host_tool
from tests.ui.stack import free_port

TEST_SCRAPE_INTERVAL = "1s"


def prometheus_service(env: dict[str, str]) -> dict:
    return load_compose(ROOT / "docker-compose.yml", env)["services"]["prometheus"]


def config_on_host(targets: dict[str, list[str]], token_file: Path) -> dict:
    """deploy/monitoring/prometheus.yml with each job's DNS names replaced by ``targets[job]`` (the addresses Docker's
    DNS would answer) and the token file's path made this host's. A job missing from ``targets`` is dropped."""
    config = yaml.safe_load((ROOT / "deploy" / "monitoring" / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = TEST_SCRAPE_INTERVAL
    jobs = []
    for job in config["scrape_configs"]:
        if job["job_name"] not in targets:
            continue
        job.pop("dns_sd_configs")
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
        auth = job.get("authorization")
        if auth:
            auth["credentials_file"] = str(token_file)
        jobs.append(job)
    config["scrape_configs"] = jobs
    return config


def dns_ports(job: str) -> list[int]:
    """The ports deploy/monitoring/prometheus.yml scrapes ``job`` on (what each container listens on)."""
    config = yaml.safe_load((ROOT / "deploy" / "monitoring" / "prometheus.yml").read_text())
    (found,) = [j for j in config["scrape_configs"] if j["job_name"] == job]
    return [sd["port"] for sd in found["dns_sd_configs"]]


@contextlib.contextmanager
def running_prometheus(targets: dict[str, list[str]], env: dict[str, str], folder: Path) -> Iterator[str]:
    """The service's command, scraping ``targets`` ({job: ["host:port", ...]}); yields Prometheus's base URL."""
    service = prometheus_service(env)
    assert service["entrypoint"] == ["/bin/sh", "-c"], service["entrypoint"]
    (script,) = service["command"]
    token_file, data = folder / "owlet_ui_token", folder / "data"
    data.mkdir()
    config_file = folder / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config_on_host(targets, token_file)))
    volumes = service["volumes"]
    inside_config = next(v.split(":")[1] for v in volumes if v.split(":")[1].endswith("prometheus.yml"))
    assert Path(mounted(inside_config, volumes, ROOT)) == ROOT / "deploy" / "monitoring" / "prometheus.yml"
    port = free_port()
    for inside, here in ((inside_config, str(config_file)), ("/tmp/owlet_ui_token", str(token_file)),
                         ("--storage.tsdb.path=/prometheus", f"--storage.tsdb.path={data}"),
                         ("--web.listen-address=:9090", f"--web.listen-address=127.0.0.1:{port}"),
                         ("exec /bin/prometheus", f"exec {host_tool('prometheus')}")):
        assert inside in script, f"{inside} is no longer in the prometheus service's command"
        script = script.replace(inside, here)
    container_env = {k: str(v) for k, v in service.get("environment", {}).items()}
    proc = Service("prometheus", ["/bin/sh", "-c", script], clean_env(**container_env), folder, folder)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.stop()


def wait_until_scraped(base: str, jobs: dict[str, int], timeout_s: float = 60.0) -> list[dict]:
    """Wait until Prometheus has scraped ``jobs`` ({job: how many targets}) and every target is up; the targets."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "api/v1/targets", timeout=5) as response:
                active = json.load(response)["data"]["activeTargets"]
        except OSError as exc:
            last = exc
            time.sleep(0.5)
            continue
        last = [(t["labels"]["job"], t["health"], t.get("lastError")) for t in active]
        counts = {job: sum(1 for t in active if t["labels"]["job"] == job and t["health"] == "up") for job in jobs}
        if counts == jobs:
            return active
        time.sleep(0.5)
    raise AssertionError(f"Prometheus did not scrape {jobs}: {last}")


def query(base: str, expression: str) -> list[dict]:
    from urllib.parse import quote

    with urllib.request.urlopen(f"{base}api/v1/query?query={quote(expression)}", timeout=10) as response:
        return json.load(response)["data"]["result"]
