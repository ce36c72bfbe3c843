"""The `monitoring` compose profile: its Prometheus scrapes every page and worker of compose's stack (run on this host
with Debian's prometheus, ``prometheus_on_host``), its configuration passes ``promtool``, and Grafana's provisioning
and dashboard are whole: every metric a panel queries is one the running page or worker exports.

Grafana itself is not packaged by Debian, so its dashboard is checked as data: its JSON, each panel's queries
(parsed by ``promtool`` as recording rules), and the metric names in them against the real /metrics of compose's
page and worker.
"""
from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from tests.deploy.compose_on_host import load_compose
from tests.deploy.compose_stack import COMPOSE_ENV, HOST, METRICS_TOKEN
from tests.deploy.prometheus_on_host import (config_on_host, dns_ports, query, running_prometheus,
                                             wait_until_scraped)
from tests.deploy.services import ROOT, host_tool, http_get

pytestmark = pytest.mark.timeout(300)
MONITORING = ROOT / "deploy" / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "owlet.json"
# PromQL words that are not metric names: functions, aggregations and keywords the dashboard may use.
PROMQL_WORDS = {"sum", "max", "min", "avg", "count", "rate", "irate", "increase", "deriv", "histogram_quantile",
                "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "topk", "bottomk", "clamp_min", "clamp_max", "abs", "time", "vector", "scalar"}


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression reads: its identifiers, less label matchers, grouping labels, words and
    durations."""
    bare = re.sub(r"\{[^}]*\}", "", expression)  # label matchers
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", bare)  # grouping labels
    bare = re.sub(r"\[[^\]]*\]", "", bare)  # range durations
    return {word for word in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare)
            if word not in PROMQL_WORDS and not re.fullmatch(r"\d+[smhd]?", word)}


def exported(text: str) -> set[str]:
    """Every series name a /metrics text offers: its samples, and each declared family's (a labelled family has no
    sample until its first label value)."""
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    for kind, family in ((m[2], m[1]) for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M)):
        names |= {family, *(family + s for s in (("_bucket", "_sum", "_count") if kind == "histogram" else ()))}
        if kind == "counter":
            names |= {family if family.endswith("_total") else family + "_total"}
    return names


def test_the_dashboard_and_grafanas_provisioning_are_whole():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"], "a dashboard with panels"
    datasources = yaml.safe_load((MONITORING / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in dashboard["panels"]:
        assert panel["title"] and panel["type"] in ("timeseries", "stat") and panel["targets"], panel["title"]
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        for target in [panel, *panel["targets"]]:
            assert target["datasource"] == {"type": "prometheus", "uid": source["uid"]}, panel["title"]
    # What the issue asks the dashboard to show, each by its metric.
    shown = {name for _title, expression in dashboard_queries() for name in metric_names(expression)}
    assert {"owlet_num_requests_waiting", "owlet_num_requests_running", "owlet_ui_refusals_total",
            "owlet_time_to_first_token_seconds_bucket", "owlet_generation_tokens_total",
            "owlet_worker_batch_occupancy", "owlet_ui_session_cache_total"} <= shown, shown
    # Compose mounts the provisioning where Grafana reads it, and the dashboards where the provider looks.
    grafana = load_compose(ROOT / "docker-compose.yml", COMPOSE_ENV)["services"]["grafana"]
    mounts = {volume.split(":")[1]: volume.split(":")[0] for volume in grafana["volumes"]}
    assert mounts["/etc/grafana/provisioning"] == "./deploy/monitoring/grafana/provisioning"
    (provider,) = yaml.safe_load((MONITORING / "grafana/provisioning/dashboards/owlet.yml").read_text())["providers"]
    assert mounts[provider["options"]["path"]] == "./deploy/monitoring/grafana/dashboards"


def test_promtool_accepts_the_configuration_and_every_dashboard_query(tmp_path):
    promtool = host_tool("promtool")
    token = tmp_path / "owlet_ui_token"
    token.write_text(METRICS_TOKEN)
    config = tmp_path / "prometheus.yml"
    # The shipped file as it is, but for the token file (which the service's command writes at start) and the DNS
    # names (promtool cannot resolve the compose network's).
    config.write_text(yaml.safe_dump(config_on_host({"owlet-ui": ["ui:7860"], "owlet-worker": ["worker:9100"]},
                                                    token)))
    checked = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"owlet:dashboard_query_{i}", "expr": expression}
                                                        for i, (_title, expression) in enumerate(dashboard_queries())]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    checked = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_prometheus_scrapes_every_page_and_worker_and_the_dashboard_reads_only_what_they_export(compose_stack,
                                                                                             tmp_path):
    stack = compose_stack
    assert dns_ports("owlet-ui") == [int(stack.services["ui"]["ports"][0].split(":")[-1])], "the page's port"
    assert dns_ports("owlet-worker") == [int(stack.services["worker"]["environment"]["OWLET_WORKER_METRICS_PORT"])]
    workers = [f"{HOST}:{port}" for port in stack.worker_metrics.values()]
    targets = {"owlet-ui": [f"{HOST}:{stack.ui_port}"], "owlet-worker": workers}
    with running_prometheus(targets, COMPOSE_ENV, tmp_path) as prometheus:
        wait_until_scraped(prometheus, {"owlet-ui": 1, "owlet-worker": len(workers)})
        alive = query(prometheus, "max(owlet_workers_alive)")
        assert alive and float(alive[0]["value"][1]) >= 1, alive

    page = http_get(stack.url + "metrics", token=METRICS_TOKEN)[1]
    worker = http_get(f"http://{HOST}:{stack.worker_metrics[1]}/metrics")[1]
    offered = exported(page) | exported(worker)
    unknown = {(title, name) for title, expression in dashboard_queries() for name in metric_names(expression)
               if name not in offered}
    assert not unknown, f"dashboard panels query metrics nobody exports: {sorted(unknown)}"
