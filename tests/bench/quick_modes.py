"""Every benchmark in bench/ still runs: its ``--quick`` mode exits 0 and ends with a RESULT line holding its figures.

Each runs as a person measuring would run it, a subprocess of this venv's python from the repository root;
queue_overhead, documented as a script path, runs from another directory. The figures of a quick run say nothing
about speed, only that the benchmark measured something. A file runs two at once (most benchmarks use one torch
thread), so under the suite's two pytest processes up to four share CI's two cores: their figures are noisier still.

BENCHMARKS lists them all; the ``test_quick_modes_*.py`` files each run one kind (``KINDS``), so that pytest-xdist
hands the kinds to both processes instead of one process running every benchmark in turn. ``test_every_benchmark_
has_one_kind`` keeps the kinds covering BENCHMARKS.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.models.mplug_owl3.layout import LAYOUTS

ROOT = Path(__file__).resolve().parents[2]
RUNS_AT_ONCE = 2
TIMEOUT_S = 300  # a quick run takes seconds; minutes means it hangs


@dataclass(frozen=True)
class QuickRun:
    argv: tuple[str, ...]  # after the python executable
    figures: tuple[str, ...]  # keys of RESULT that must be finite numbers
    cwd: Path = ROOT
    expect: dict = field(default_factory=dict)  # keys of RESULT with the exact value a working run gives
    within: dict = field(default_factory=dict)  # keys of RESULT with the (low, high) bounds any working run meets


def module(name: str, *extra: str) -> tuple[str, ...]:
    return ("-m", f"bench.{name}", "--quick", *extra)


# delivered over ideal well above 1 would be answers faster than the engine makes tokens: a broken measure. The
# ideal counts `tokens` intervals per answer, while the stub's first token is due at once (16 / 15 = 1.067), and
# a 2 s window may count answers begun before it: so the bound is 1.12, not 1.
STACK_CEILING_MAX = 1.12


BENCHMARKS = {
    "abuse": QuickRun(module("abuse"), (
        "honest_wait_over_service_max", "honest_first_token_over_service_max",
        "per_identity_honest_wait_over_service_max", "fifo_honest_wait_over_service_max",
        "long_first_token_over_service_max", "long_first_token_over_service_max_no_slicing",
        "crowd_visitor_first_token_s_max", "crowd_follow_up_first_token_s_max", "crowd_heavy_wait_over_crowd_wait",
        "api_honest_wait_over_service_max", "api_honest_first_token_over_service_max"),
        expect={"crowd_errors": 0, "api_flood_groups": 1, "api_refused": 0}),
    # the share front's visitors are told apart (4 client groups) and none is refused, with the hostile one looping
    "crowd": QuickRun(module("crowd"), (
        "accuracy", "ttft_p50_s", "ttft_p95_s", "service_s", "honest_worst_wait_over_service", "hostile_asked"),
        expect={"refused": 0, "failed": 0, "honest_groups": 4, "turns": 8}),
    "fairness": QuickRun(module("fairness"), (
        "light_wait_over_service_max", "fifo_light_wait_over_service_max", "light_first_token_over_service_max",
        "light_overtaken_max")),
    "page_stream": QuickRun(module("page_stream"), (
        "cpu_ms_per_update", "cpu_ms_per_short_turn", "streams_per_core", "updates_per_s_per_user_min",
        "token_to_client_p95_ms", "token_to_client_p95_after_first_second_ms"),
        expect={"final_text_identical": "8/8"}),
    "queue_overhead": QuickRun((str(ROOT / "bench" / "queue_overhead.py"), "--quick"), (
        "p50_added_ms", "p95_added_ms", "ttft_in_process_p50_ms", "ttft_queue_p50_ms", "token_delivery_p50_ms"),
        cwd=Path(tempfile.gettempdir())),
    "engine": QuickRun(module("engine"), (
        "sequential_tok_s", "static_tok_s", "engine_tok_s", "vs_sequential", "vs_static", "engine_tok_s_poisson",
        "vs_static_poisson", "burst_prefill_forwards_alone", "burst_prefill_forwards_batched",
        "burst_ttft_p50_alone_over_batched", "burst_ttft_p95_alone_over_batched"),
        expect={"tokens_equal": True, "burst_prefill_forwards_alone": 16}),
    "prefill_burst": QuickRun(module("prefill_burst"), (
        "burst_prefill_forwards_batched", "burst_ttft_p50_alone_over_batched", "burst_ttft_p95_alone_over_batched"),
        expect={"burst_tokens_agree": True, "burst_prefill_forwards_alone": 16}),
    "step_profile": QuickRun(module("engine", "--profile"), (
        "dynamic_step_ms", "slots_step_ms", "dynamic_bookkeeping_pct", "slots_bookkeeping_pct", "slots_speedup")),
    "gpu_decode": QuickRun(module("gpu_decode"), (
        "decode_tok_s_b1_graphs_off", "decode_tok_s_b4_graphs_off", "decode_tok_s_b1_graphs_static",
        "decode_tok_s_b4_graphs_static", "ttft_s_graphs_off", "followup_ttft_s_graphs_static",
        "b1_bandwidth_limit_tok_s")),
    "gpu_sdpa_shapes": QuickRun(module("gpu_sdpa_shapes"), (
        "torch_new_shape_ms", "torch_seen_shape_ms", "engine_new_shape_ms", "engine_seen_shape_ms")),
    "stack_ceiling": QuickRun(module("stack_ceiling"), (
        "delivered_over_ideal_16", "jobs_per_s_16", "ttft_p50_ms_16", "ttft_p95_ms_16", "ttft_written_p50_ms_16",
        "worker_cpu_ms_per_job_16"), expect={"errors": 0},
        within={"delivered_over_ideal_16": (0.02, STACK_CEILING_MAX)}),
    "stack_ceiling_page": QuickRun(module("stack_ceiling", "--page"), (
        "delivered_over_ideal_16", "ttft_p50_ms_16", "worker_cpu_ms_per_job_16", "page_cpu_ms_per_turn_16"),
        expect={"errors": 0, "page": True}, within={"delivered_over_ideal_16": (0.02, STACK_CEILING_MAX)}),
    # the whole stack against the engine alone, on the CPU with the tiny model: nothing delivered is a broken stack
    "gpu_stack": QuickRun(module("gpu_stack"), (
        "engine_tokens_per_s", "stack_tokens_per_s", "stack_over_engine", "stack_ttft_p50_ms", "stack_ttft_p95_ms"),
        expect={"errors": 0}, within={"stack_over_engine": (0.05, 3.0)}),
    # the queue's cost per operation must not grow with the line: the same commands at 60 waiting as at 20
    "queue_scale": QuickRun(module("queue_scale"), (
        "new_position_cmds_20", "new_submit_cmds_60", "new_pop_us_60", "new_tabs_redis_cores_40",
        "new_steps_cmds_per_turn", "new_steps_cpu_us_per_turn", "new_steps_engines_per_redis_core_16",
        "new_steps_round_trips_per_turn_conv4", "new_steps_cpu_us_per_turn_conv4",
        "new_cmds_per_turn_16", "new_redis_us_per_turn_16", "new_engines_per_redis_core_16",
        "new_scripts_us_per_turn_16", "new_outside_scripts_us_per_turn_16"),
        expect={"new_errors_16": 0},
        within={"position_cmds_ratio_largest_over_smallest": (0.8, 1.25),
                "submit_cmds_ratio_largest_over_smallest": (0.8, 1.25),
                "pop_cmds_ratio_largest_over_smallest": (0.8, 1.25)}),
    # each helper of the queue's scripts timed in place: its own times must add up to about the scripts' time; the
    # commands the scripts call are a part of the scripts' time, never none of it nor more than all
    "queue_lua_profile": QuickRun(module("queue_lua_profile"), (
        "redis_us_per_turn", "scripts_us_per_turn", "cmds_per_turn", "profiled_own_us_per_turn", "timer_cost_us",
        "commands_us_per_turn", "script_overhead_us_per_turn", "outside_scripts_us_per_turn", "call_cost_us",
        "floor_us_per_turn"),
        within={"profiled_over_scripts": (0.5, 2.0), "commands_over_scripts": (0.05, 1.0)}),
    # a model queue with only the writes every design keeps: fewer commands a turn than Owlet's, and both run
    "queue_floor": QuickRun(module("queue_floor"), (
        "floor_us_per_turn", "owlet_us_per_turn", "floor_cmds_per_turn", "owlet_cmds_per_turn", "ping_us"),
        expect={"floor_round_trips_per_turn": 2.0, "owlet_round_trips_per_turn": 2.0},
        within={"owlet_over_floor": (0.5, 20.0), "owlet_cmds_over_floor": (1.0, 10.0)}),
    "multiturn": QuickRun(module("multiturn"), (
        "followup_ttft_ratio", "int8_bytes_ratio", "int4_bytes_ratio", "session_hit_rate")),
    **{f"multiturn_mplug_owl3_{layout}": QuickRun(
        module("multiturn", "--family", "mplug-owl3", "--owl-layout", layout),
        ("followup_ttft_ratio", "int8_bytes_ratio", "int4_bytes_ratio", "session_hit_rate"),
        expect={"layout": layout}) for layout in LAYOUTS},
    # after a restart, every follow-up is served from the disk tier; with it, more conversations keep their cache
    "cache_tiers": QuickRun(module("cache_tiers"), (
        "followup_ttft_ratio", "read_over_prefill_per_token", "sessions_per_gb_ratio", "index_bytes_per_file"),
        expect={"served_from_disk": 2, "conversations": 2}, within={"sessions_per_gb_ratio": (1.01, 1e6)}),
    # a warm example turn restores all of its prompt but one token; a fresh worker restores nothing
    "prefix_sharing": QuickRun(module("prefix_sharing"), (
        "cold_ttft_ms", "warm_example_ttft_ratio", "warm_other_question_ttft_ratio", "features_only_ttft_ratio")),
    "peers": QuickRun(module("peers"), ("owlet_tok_s", "hf_cb_tok_s", "vs_hf_cb"), expect={"tokens_agree": True}),
    "soak": QuickRun(module("soak"), (
        "turns_answered", "page_mb_per_min", "worker_mb_per_min", "worker_beyond_caches_mb_per_min",
        "redis_mb_per_min", "redis_bytes_per_turn", "redis_bytes_per_conversation", "redis_model_mb_per_min",
        "redis_over_model"),
        expect={"errors": 0, "all_answered": True, "sampled_throughout": True}),
    "varlen": QuickRun(module("varlen"), (
        "padded_ms", "varlen_ms", "speedup", "padded_padding_pct", "varlen_padding_pct"),
        expect={"tokens_agree": True}),
}


@dataclass
class Finished:
    returncode: int
    output: str
    seconds: float


def run_quick(run: QuickRun) -> Finished:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    start = time.monotonic()
    done = subprocess.run([sys.executable, *run.argv], cwd=run.cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S)
    return Finished(done.returncode, done.stdout, time.monotonic() - start)


@pytest.fixture(scope="module")
def quick_runs(request) -> dict[str, Future]:
    """The runs this session selected in the requesting file, started RUNS_AT_ONCE at a time in BENCHMARKS' order
    (slowest first)."""
    chosen = {item.callspec.params["name"] for item in request.session.items
              if getattr(item, "originalname", None) == "test_quick_mode" and hasattr(item, "callspec")
              and item.module is request.module}
    with ThreadPoolExecutor(RUNS_AT_ONCE) as pool:
        futures = {name: pool.submit(run_quick, run) for name, run in BENCHMARKS.items() if name in chosen}
        yield futures


def last_result(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, "no RESULT line"
    return json.loads(lines[-1][len("RESULT "):])  # json.loads reads NaN: the check below refuses it


# Which test file runs which benchmark: the longest (abuse, soak, gpu_stack) each in a different file.
KINDS = {
    "queue": ("abuse", "crowd", "fairness", "queue_overhead", "queue_scale", "queue_lua_profile", "queue_floor"),
    "stack": ("gpu_stack", "soak", "page_stream", "stack_ceiling", "stack_ceiling_page"),
    "engine": ("engine", "prefill_burst", "step_profile", "gpu_decode", "gpu_sdpa_shapes", "multiturn",
               *(f"multiturn_mplug_owl3_{layout}" for layout in LAYOUTS), "cache_tiers", "prefix_sharing", "peers",
               "varlen"),
}


def kind(name: str) -> list[str]:
    """The benchmarks of one kind, in BENCHMARKS' order (the order they start in)."""
    return [bench for bench in BENCHMARKS if bench in KINDS[name]]


def check_quick_mode(name: str, quick_runs: dict[str, Future]) -> None:
    run = BENCHMARKS[name]
    finished = quick_runs[name].result()
    tail = finished.output[-4000:]
    assert finished.returncode == 0, f"bench.{name} --quick exited {finished.returncode}:\n{tail}"
    result = last_result(finished.output)
    for key in run.figures:
        value = result.get(key)
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), \
            f"bench.{name} --quick: RESULT's {key} is {value!r}, not a number:\n{tail}"
    for key, value in run.expect.items():
        assert result.get(key) == value, \
            f"bench.{name} --quick: RESULT's {key} is {result.get(key)!r}, not {value!r}:\n{tail}"
    for key, (low, high) in run.within.items():
        assert low <= result[key] <= high, f"bench.{name} --quick: RESULT's {key} is {result[key]!r}, not in " \
                                           f"[{low}, {high}]:\n{tail}"
