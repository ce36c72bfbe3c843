"""Print the README's sample conversation: the bundled example picture, asked in one session through LLMEngine.

    .venv/bin/python scripts/sample_conversation.py [--model models/owlet-shapes-vl] [--dtype float32]

Each turn carries the model's own earlier answers, as in the page; the last column shows how much of each
prompt the session cache served.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PIL import Image  # noqa: E402

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from training.demo_model import DEFAULT_MODEL_DIR  # noqa: E402
from training.example_scenes import EXAMPLES_DIR  # noqa: E402

PICTURE = "three-shapes.png"  # a red circle on the left, a blue square on the right, a yellow star at the bottom
QUESTIONS = ("What color is the circle?", "how many shapes?", "is there a blue square?",
             "describe this image", "where is the circle?", "Where's the square?", "what is the capital of france?")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEFAULT_MODEL_DIR))
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    image = Image.open(EXAMPLES_DIR / PICTURE).convert("RGB")
    engine = LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, device="cpu")).start()
    messages: list[dict] = []
    try:
        for i, question in enumerate(QUESTIONS):
            content = [{"type": "text", "text": question}]
            if i == 0:
                content.insert(0, {"type": "image", "image": image})
            messages.append({"role": "user", "content": content})
            result = engine.add_request(messages, SamplingParams(max_new_tokens=32, temperature=0.0),
                                        session_id="readme-sample").result(timeout=300)
            answer = result.text.strip()
            messages.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
            asked = ("[image] " if i == 0 else "") + question
            print(f"user:  {asked:<36} owlet: {answer:<58} "
                  f"({result.stats.cached_tokens}/{result.stats.prompt_tokens} cached)")
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
