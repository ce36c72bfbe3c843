"""Continuous batching must not change what the model says: fp32 greedy tokens equal per-request generate()."""

from engine import FinishReason, greedy

from .helpers import chat, image, reference_tokens, run_until_done, serve_staggered

QUESTIONS = ["What colour is it?", "Describe the image in detail, please.", "Is there a circle?",
             "How many shapes are there, and where is the largest one?", "hi", "Tell me a story about owls. " * 4,
             "Where is the star?"]


def workload():
    """7 requests: different images and sizes, prompt lengths and max_new_tokens; two are text-only."""
    reqs = []
    for i, q in enumerate(QUESTIONS):
        img = None if i in (2, 5) else image(i, size=(48 + 16 * i, 64 + 8 * (i % 3)))
        reqs.append((chat(q, img), 4 + 5 * i))
    return reqs


def test_staggered_arrivals_match_generate(family, make_engine, runners):
    engine = make_engine(family, max_running=4)
    reqs = workload()
    handles = serve_staggered(engine, reqs)
    assert engine.stats()["mean_batch_occupancy"] > 1.5, "requests were not batched together"
    for (messages, n), h in zip(reqs, handles):
        result = h.result(timeout=0)
        assert result.token_ids == reference_tokens(runners(family), messages, n)
        assert result.finish_reason in (FinishReason.LENGTH, FinishReason.EOS)


def test_abort_mid_flight_leaves_others_exact(family, make_engine, runners):
    engine = make_engine(family, max_running=8)
    reqs = workload()
    handles = [engine.add_request(m, greedy(n)) for m, n in reqs]
    for _ in range(4):
        engine.step()
    victim = handles[6]
    assert engine.abort(victim.request_id)
    run_until_done(engine)
    cancelled = victim.result(timeout=0)
    assert cancelled.finish_reason is FinishReason.CANCELLED
    assert 0 < len(cancelled.token_ids) < reqs[6][1]
    for (messages, n), h in list(zip(reqs, handles))[:6]:
        assert h.result(timeout=0).token_ids == reference_tokens(runners(family), messages, n)


def test_chunked_prefill_matches_generate(family, make_engine, runners):
    """A prompt longer than max_prefill_tokens is prefilled over several steps while another request decodes."""
    engine = make_engine(family, max_prefill_tokens=16)
    short = (chat("hi"), 12)
    long = (chat("Describe everything you can see. " * 6, image(3, (96, 96))), 10)
    h1 = engine.add_request(*short[:1], greedy(short[1]))
    engine.step()
    h2 = engine.add_request(long[0], greedy(long[1]))
    steps_before = engine.stats()["steps"]
    run_until_done(engine)
    assert engine.stats()["steps"] - steps_before > len(long[0][0]["content"][1]["text"]) // 64
    assert h1.result(0).token_ids == reference_tokens(runners(family), *short)
    assert h2.result(0).token_ids == reference_tokens(runners(family), *long)


def test_background_loop_many_producer_threads(family, make_engine, runners):
    import threading

    engine = make_engine(family, max_running=4).start()
    reqs = workload()
    results = [None] * len(reqs)

    def produce(i):
        h = engine.add_request(reqs[i][0], greedy(reqs[i][1]))
        deltas = list(h)
        results[i] = (deltas, h.result(timeout=30))

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for (messages, n), (deltas, result) in zip(reqs, results):
        assert "".join(deltas) == result.text
        assert result.token_ids == reference_tokens(runners(family), messages, n)
        assert result.stats.ttft_s is not None and result.stats.generated_tokens == len(result.token_ids)
