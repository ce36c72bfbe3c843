"""Exact-match accuracy of a checkpoint on freshly generated, held-out multi-turn scene dialogues.

    python -m training.eval --scenes 500 [--model models/owlet-shapes-vl]

Each scene gets a 4-turn dialogue; the image rides on the first turn only. Turns are answered in order
with greedy decoding, and the model's own earlier answers stay in the history, as in a real chat.
Prints a table per question type and per turn, then one line: RESULT {"accuracy": ..., ...}.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

from training.demo_model import DEFAULT_MODEL_DIR
from training.dialogues import QUESTION_TYPES, Turn, to_messages
from training.examples import eval_dialogue
from training.scenes import render_scene

TURNS_PER_SCENE = 4
MAX_NEW_TOKENS = 32  # the longest canonical answer ("a red circle, ... and a blue star") is ~20 tokens


def load(model_dir: Path):
    """Model and processor, loaded offline from the folder like any checkpoint."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    return model.eval(), processor


@torch.inference_mode()
def answer_batch(model, processor, chats: list[list[dict]]) -> list[str]:
    """Greedy answers to the last user turn of each chat (batched, left padded)."""
    texts = [processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) for chat in chats]
    images = [[item["image"] for m in chat for item in m["content"] if item["type"] == "image"] for chat in chats]
    processor.tokenizer.padding_side = "left"
    inputs = processor(images=images, text=texts, padding=True, return_tensors="pt")
    out = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW_TOKENS)
    new_tokens = out[:, inputs["input_ids"].shape[1]:]
    return [t.strip() for t in processor.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]


def evaluate(model, processor, scenes: int, batch_size: int = 50, progress: bool = False) -> dict:
    """Score `scenes` held-out dialogues; returns overall, per-type and per-turn accuracy plus failures."""
    right: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # key -> [correct, total]
    failures: list[dict] = []
    for first in range(0, scenes, batch_size):
        batch = [eval_dialogue(i, TURNS_PER_SCENE) for i in range(first, min(first + batch_size, scenes))]
        images = [render_scene(scene) for scene, _ in batch]
        answers: list[list[str]] = [[] for _ in batch]
        for k in range(TURNS_PER_SCENE):
            rows = [i for i, (_, turns) in enumerate(batch) if k < len(turns)]
            chats = []
            for i in rows:
                history = [Turn(t.qtype, t.question, a) for t, a in zip(batch[i][1], answers[i])]
                chats.append(to_messages(images[i], history + [batch[i][1][k]], answered=k))
            for i, answer in zip(rows, answer_batch(model, processor, chats)):
                answers[i].append(answer)
                turn = batch[i][1][k]
                ok = answer == turn.answer
                for key in ("all", f"type:{turn.qtype}", f"turn:{k + 1}"):
                    right[key][0] += ok
                    right[key][1] += 1
                if not ok:
                    failures.append({"scene": first + i, "turn": k + 1, "question": turn.question,
                                     "expected": turn.answer, "got": answer})
        if progress:
            print(f"  {min(first + batch_size, scenes)}/{scenes} scenes, running accuracy "
                  f"{right['all'][0] / right['all'][1]:.4f}", flush=True)
    ratio = {key: c / n for key, (c, n) in right.items()}
    return {
        "accuracy": ratio["all"],
        "questions": right["all"][1],
        "per_type": {t: ratio[f"type:{t}"] for t in QUESTION_TYPES if f"type:{t}" in ratio},
        "per_type_count": {t: right[f"type:{t}"][1] for t in QUESTION_TYPES if f"type:{t}" in right},
        "per_turn": {k: ratio[f"turn:{k}"] for k in range(1, TURNS_PER_SCENE + 1) if f"turn:{k}" in ratio},
        "failures": failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--scenes", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--show-failures", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.monotonic()
    model, processor = load(args.model)
    report = evaluate(model, processor, args.scenes, args.batch_size, progress=True)
    print(f"\n{'question type':<14}{'questions':>10}{'accuracy':>10}")
    for qtype, acc in report["per_type"].items():
        print(f"{qtype:<14}{report['per_type_count'][qtype]:>10}{acc:>10.4f}")
    for k, acc in report["per_turn"].items():
        print(f"{'turn ' + str(k):<14}{'':>10}{acc:>10.4f}")
    print(f"{'overall':<14}{report['questions']:>10}{report['accuracy']:>10.4f}")
    for failure in report["failures"][: args.show_failures]:
        print("  miss:", json.dumps(failure))
    result = {"accuracy": round(report["accuracy"], 4), "questions": report["questions"], "scenes": args.scenes,
              "per_type": {k: round(v, 4) for k, v in report["per_type"].items()},
              "seconds": round(time.monotonic() - start, 1)}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
