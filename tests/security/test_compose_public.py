"""docker-compose.yml as a public deployment: Redis bounded without silent eviction, Flower behind a login."""
from __future__ import annotations

import yaml

from tests.ui.stack import ROOT


def services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def test_redis_is_bounded_and_never_evicts_jobs_or_history():
    command = services()["redis"]["command"]
    assert "--maxmemory" in command
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"


def test_flower_needs_a_login_and_is_not_published_to_the_world():
    flower = services()["flower"]
    assert "FLOWER_BASIC_AUTH" in flower["environment"]
    assert "FLOWER_BASIC_AUTH" in " ".join(flower["command"]) and "exit 1" in " ".join(flower["command"])
    assert all(str(p).startswith("127.0.0.1:") for p in flower["ports"])


def test_ui_gets_the_public_settings():
    env = services()["ui"]["environment"]
    for name in ("OWLET_UI_IDENTITY_KEY", "OWLET_UI_TRUSTED_PROXIES", "OWLET_UI_METRICS_TOKEN"):
        assert name in env, name


def test_the_public_proxy_is_the_pages_trusted_proxy_and_no_other_container_can_hold_its_address():
    import ipaddress

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    proxy = ipaddress.ip_address(compose["services"]["proxy"]["networks"]["default"]["ipv4_address"])
    assert f":-{proxy}}}" in compose["services"]["ui"]["environment"]["OWLET_UI_TRUSTED_PROXIES"]
    (network,) = compose["networks"]["default"]["ipam"]["config"]
    assert proxy in ipaddress.ip_network(network["subnet"])
    assert proxy not in ipaddress.ip_network(network["ip_range"]), "containers are given addresses from ip_range"
    assert proxy != next(ipaddress.ip_network(network["subnet"]).hosts()), "nor is it the gateway's"
