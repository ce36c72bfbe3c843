"""Attack: ignoring Retry-After. A client that asks again the moment it is refused was refused about 120 times a
second, each refusal read, checked and sent to Redis's admission script. Now an address past
``address_refusals`` refusals in the window is braked: its asking requests are refused before any work, after a
second, with their own code (``ui.edge.refusal_brake``). And the two limits one code used to name are told apart:
the address's turn rate (``turn_rate_limited``, Retry-After: when the window admits a turn) and its open requests
(``too_many_open_requests``, Retry-After: a few seconds, since one ending frees it)."""
from __future__ import annotations

import contextlib
import threading
import time

import httpx
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from tests.fake_clock import FakeClock
from tests.redis_server import running_redis, unique_prefix
from tests.security.attack import METRICS_TOKEN, cancel_jobs, http
from tests.ui.stack import free_port, launched_page, make_image
from ui.edge.refusal_brake import RefusalLedger

pytestmark = pytest.mark.timeout(180)
REFUSALS = 3


def test_the_ledger_brakes_past_its_count_until_the_oldest_refusal_leaves_the_window():
    clock = FakeClock()
    ledger = RefusalLedger(3, 60, clock=clock)
    for _ in range(2):
        ledger.note("a", "turn_rate_limited")
        clock.now += 10
    assert ledger.braked_for("a") is None, "two refusals: not braked"
    ledger.note("a", "turn_rate_limited")
    assert ledger.braked_for("a") == pytest.approx(40), "braked until the first refusal leaves the window"
    assert ledger.braked_for("b") is None, "another address is not"
    ledger.braked()  # a braked refusal does not prolong the brake
    clock.now += 40
    assert ledger.braked_for("a") is None


@contextlib.contextmanager
def strict_page():
    """A page whose client admits 2 turns per address per minute, holds 2 open requests per address and kind, and
    brakes an address after 3 refusals a minute; no worker, so admitted answers stay open."""
    from ui.config import UIConfig
    from worker.client import OwletClient
    from worker.config import Settings

    with running_redis() as redis_url:
        prefix = unique_prefix("brake")
        client = OwletClient(settings=Settings.from_env(redis_url=redis_url, key_prefix=prefix, group_submit_limit=2,
                                                        group_job_cap=10))
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=prefix, trusted_proxies=("127.0.0.1",),
                          address_max_connections=2, address_refusals=REFUSALS, address_max_events=8,
                          metrics_token=METRICS_TOKEN)
        with launched_page(config, client) as (url, owlet):
            yield url, owlet


def ask(url: str, address: str, key: str | None = None) -> httpx.Response:
    """One streamed chat completion, read until its first line (admitted answers stay open: no worker)."""
    with http(forwarded=address, timeout=30) as client:
        key = key or client.get(url + "v1/key").json()["key"]
        body = {"model": "any", "stream": True, "messages": [{"role": "user", "content": "hello?"}]}
        with client.stream("POST", url + "v1/chat/completions", json=body,
                           headers={"Authorization": f"Bearer {key}"}) as response:
            response.read() if response.status_code != 200 else None
            return response


class Held(threading.Thread):
    """A streamed chat completion kept open until the page ends it."""

    def __init__(self, url: str, address: str):
        super().__init__(daemon=True)
        self.url, self.address, self.status, self.opened = url, address, None, threading.Event()
        self.start()

    def run(self):
        try:
            with http(forwarded=self.address, timeout=60) as client:
                key = client.get(self.url + "v1/key").json()["key"]
                body = {"model": "any", "stream": True, "messages": [{"role": "user", "content": "hold"}]}
                with client.stream("POST", self.url + "v1/chat/completions", json=body,
                                   headers={"Authorization": f"Bearer {key}"}) as response:
                    self.status = response.status_code
                    self.opened.set()
                    for _ in response.iter_lines():
                        pass
        finally:
            self.opened.set()


def api_error(response: httpx.Response) -> tuple[str, int]:
    return response.json()["error"]["code"], int(response.headers["retry-after"])


def test_each_limit_has_its_code_and_a_client_ignoring_retry_after_is_braked(tmp_path):
    with strict_page() as (url, owlet):
        # Two open answers from one address: a third is past its open-request cap.
        held = [Held(url, "198.51.100.20") for _ in range(2)]
        for h in held:
            assert h.opened.wait(30) and h.status == 200, h.status
        code, retry = api_error(ask(url, "198.51.100.20"))
        assert (code, retry) == ("too_many_open_requests", 5), (code, retry)
        cancel_jobs(owlet)  # the answers end: the open requests are free again, the turns stay counted
        for h in held:
            h.join(30)
        code, retry = api_error(ask(url, "198.51.100.20"))
        assert code == "turn_rate_limited" and 50 <= retry <= 60, (code, retry)

        # The third refusal in the window brakes the address: refused before any work, after a second.
        assert api_error(ask(url, "198.51.100.20"))[0] == "turn_rate_limited"
        started = time.monotonic()
        code, retry = api_error(ask(url, "198.51.100.20"))
        assert code == "refusals_limited" and 40 <= retry <= 60 and time.monotonic() - started >= 0.9, (code, retry)
        assert owlet.queue_stats()["queued"] == 0, "nothing admitted"
        # Many at once: a few wait their second, the rest are refused at once; none does any work.
        results = []
        threads = [threading.Thread(target=lambda: results.append(api_error(ask(url, "198.51.100.20"))))
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [c for c, _ in results] == ["refusals_limited"] * 8, results
        assert owlet.queue_stats()["queued"] == 0

        # The page's own turns and gradio_client's uploads hear the same sentence.
        braked = Client(url, verbose=False, headers={"X-Forwarded-For": "198.51.100.20"})
        token = braked.predict(None, api_name="/identity")
        status = braked.predict({"text": "hello?", "files": []}, 8, token, api_name="/chat")[2]
        assert status.startswith("Too many refused requests from your network") and "wait" in status, status
        picture = handle_file(str(make_image(tmp_path / "p.png")))
        with pytest.raises(AppError, match="^Your picture was not uploaded: Too many refused requests from your"):
            braked.predict({"text": "and this?", "files": [picture]}, 8, token, api_name="/chat")
        braked.close()

        # Another address is untouched, and the operator sees each refusal by its code.
        other = Held(url, "198.51.100.21")
        assert other.opened.wait(30) and other.status == 200
        cancel_jobs(owlet)
        other.join(30)
        metrics = httpx.get(url + "metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text
        for reason in ("too_many_open_requests", "turn_rate_limited", "refusals_limited"):
            assert f'owlet_ui_refusals_total{{reason="{reason}"}}' in metrics, reason
