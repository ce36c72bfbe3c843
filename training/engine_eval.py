"""Engine-mode evaluation: the held-out conversations answered through `LLMEngine`, as users meet the model.

`--users` conversations run at once, each in its own thread like a server handler: it sends turn k with its
own earlier answers as history, under one session id (so the session cache reuses the earlier turns' KV), and
waits for the answer before the next turn. The engine batches whatever turns are in flight together, as it
does for real traffic. Scene dialogues and out-of-domain probes are interleaved, so both share batches.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from training.demo_model import describe_style_of
from training.eval import (MAX_NEW_TOKENS, chat_so_far, probe_examples, scene_examples, score)
from training.examples import Example

TURN_TIMEOUT_S = 600  # a turn that takes longer means the engine is stuck; fail loudly, never hang


def converse(engine, example: Example, session_id: str) -> list[str]:
    """Answer every turn of `example` in order, one engine request per turn, within one session."""
    from engine import FinishReason, SamplingParams

    answers: list[str] = []
    for k in range(len(example.turns)):
        handle = engine.add_request(chat_so_far(example, answers, k),
                                    SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=0.0),
                                    session_id=session_id)
        result = handle.result(timeout=TURN_TIMEOUT_S)
        if result.finish_reason not in (FinishReason.EOS, FinishReason.LENGTH):
            raise RuntimeError(f"{session_id} turn {k + 1} ended with {result.finish_reason}: {result.error}")
        answers.append(result.text.strip())
    return answers


def evaluate_engine(model_dir: Path, scenes: int, probes: int, users: int = 16, progress: bool = False,
                    phrasings: bool = False, exists_pairs: bool = False) -> dict:
    from engine import EngineConfig, LLMEngine

    scene_set = scene_examples(scenes, describe_style_of(model_dir), phrasings, exists_pairs)
    probe_set = probe_examples(probes)
    # Interleave: one probe after every few scenes, so in-domain and out-of-domain turns share decode batches.
    jobs = [("scene", i) for i in range(scenes)]
    step = max(1, scenes // max(1, probes))
    for j in range(probes):
        jobs.insert(min(len(jobs), (j + 1) * step + j), ("probe", j))
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", device="cpu", max_running=users,
                                    session_cache=True)).start()
    answers: dict[tuple[str, int], list[str]] = {}
    start = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=users, thread_name_prefix="eval-user") as pool:
            futures = {job: pool.submit(converse, engine, (scene_set if job[0] == "scene" else probe_set)[job[1]],
                                        f"eval-{job[0]}-{job[1]}") for job in jobs}
            for n, (job, future) in enumerate(futures.items(), 1):
                answers[job] = future.result()
                if progress and (n % 50 == 0 or n == len(jobs)):
                    print(f"  {n}/{len(jobs)} conversations, {time.monotonic() - start:.0f} s", flush=True)
        stats = engine.stats()
    finally:
        engine.stop()
    report = score(scene_set, [answers[("scene", i)] for i in range(scenes)],
                   probe_set, [answers[("probe", j)] for j in range(probes)])
    report["engine_stats"] = stats
    return report
