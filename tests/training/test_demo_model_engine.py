"""The demo model answers a known scene correctly through Owlet's engine (the serving path, not generate()).

Two conversations run at once, so their turns share decode batches; follow-ups reuse the session cache.
"""

import threading

from engine import EngineConfig, FinishReason, LLMEngine, SamplingParams
from training.dialogues import Turn, describe, position_of, to_messages
from training.example_scenes import EXAMPLES
from training.scenes import Scene, Shape, render_scene

# Scene A is the page's first example picture (ui/examples/three-shapes.png), the one visitors meet first; scene B
# is hand-placed, so the ground truth is plain to read here.
SCENE_A = EXAMPLES["three-shapes"][0]
TURNS_A = [
    Turn("colour", "what colour is the circle?", "red"),
    Turn("exists", "is there a blue square?", "yes"),
    Turn("count", "how many shapes are there?", "3"),
    Turn("where", "where is the circle?", "left"),
    Turn("describe", "describe the image.", "a red circle, a blue square and a yellow star"),
]
SCENE_B = Scene(
    shapes=(Shape("triangle", "green", 128, 55, 40), Shape("triangle", "purple", 70, 190, 18)),
    background="plain", background_tone=(240, 235, 230), seed=2,
)
TURNS_B = [
    Turn("count", "How many triangles are there?", "2"),
    Turn("exists", "is there a purple triangle?", "yes"),
    Turn("largest", "which shape is the largest?", "the green triangle"),
    Turn("exists", "Is there a red square?", "no"),
]


def _converse(engine: LLMEngine, scene: Scene, turns: list[Turn], session: str, out: dict) -> None:
    image = render_scene(scene)
    answers: list[str] = []
    for k, turn in enumerate(turns):
        history = [Turn(t.qtype, t.question, a) for t, a in zip(turns, answers)]
        messages = to_messages(image, history + [turn], answered=k)
        handle = engine.add_request(messages, SamplingParams(max_new_tokens=32, temperature=0.0), session_id=session)
        streamed = "".join(handle)
        result = handle.result(timeout=120)
        assert result.text == streamed, "streamed deltas must add up to the final text"
        assert result.finish_reason == FinishReason.EOS, f"turn {k + 1} ended with {result.finish_reason}"
        answers.append(result.text.strip())
    out["answers"] = answers


def test_known_scenes_answered_through_engine(demo_model_dir):
    # The hand-written truth agrees with the generator's rules.
    assert describe(SCENE_A) == TURNS_A[4].answer and position_of(SCENE_A.shapes[0]) == TURNS_A[3].answer
    engine = LLMEngine(EngineConfig(model=str(demo_model_dir), dtype="float32", device="cpu")).start()
    try:
        results = {"a": {}, "b": {}}
        threads = [threading.Thread(target=_converse, args=(engine, SCENE_A, TURNS_A, "conv-a", results["a"])),
                   threading.Thread(target=_converse, args=(engine, SCENE_B, TURNS_B, "conv-b", results["b"]))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads), "a conversation did not finish"
    finally:
        engine.stop()
    assert results["a"].get("answers") == [t.answer for t in TURNS_A]
    assert results["b"].get("answers") == [t.answer for t in TURNS_B]
