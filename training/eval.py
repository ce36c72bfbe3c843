"""Exact-match accuracy of a checkpoint on freshly generated, held-out multi-turn conversations.

    python -m training.eval --scenes 500 [--mode generate|engine] [--model models/owlet-shapes-vl]

Each scene gets a 4-turn dialogue; the image rides on the first turn only. Turns are answered in order with
greedy decoding, and each conversation's own earlier answers stay in its history, as in a real chat.
Out-of-domain probes (training/recipe.py: pictures that are not scenes, off-topic questions from a held-out
pool, text-only chats; 2 turns each) check that the model gives its one refusal, `OOD_REPLY`.

Three ways to answer:
- `generate` (default): Hugging Face `generate()`, one batch per turn index, left padded;
- `engine`: through Owlet's `LLMEngine` as the server runs it: `--users` conversations at a time, each a
  session (the session cache reuses its earlier turns), their turns batched together by the engine;
- `teacher-forced`: like `generate`, but the history holds the true answers instead of the model's own (the
  older offline figure, kept for comparison: it hides how one wrong answer can mislead the next turn).

`--phrasings` asks every scene question in another form ("What color is the circle?", "how many squares?",
training/phrasings.py) on the same scenes, with the same answers.

`--exists-pairs` asks, of each held-out scene, two "is there a ...?" questions with the same answer (both yes or
both no; half the scenes each). The standard dialogues, like the training ones, ask one "yes" and one "no" of a
scene, so they cannot tell a model that looks at the picture from one that answers the second question as the
opposite of the first. Turn 2's accuracy is the figure to read.

`--explain` prints, under each missed scene question, the scene's shapes: size, how much shows, the gap to the
nearest shape and to a twin (training/miss_geometry.py).

Prints tables per question type, per turn and per probe family, then one line:
RESULT {"accuracy", "min_type_accuracy", "ood_reply_rate", "in_domain_refusal_rate", ...}.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict
from pathlib import Path

import torch

from training.demo_model import DEFAULT_MODEL_DIR, describe_style_of
from training.dialogues import QUESTION_TYPES, Turn, exists_question, to_messages
from training.examples import Example, eval_dialogue
from training.ood import OOD_REPLY
from training.phrasings import rephrase
from training.recipe import ood_probe, probe_family
from training.scenes import generate_scene, render_scene

PHRASINGS_SEED_BASE = 5 * 10**9  # the other forms' draws for eval scene i; disjoint from every other seed
EXISTS_PAIRS_SEED_BASE = 6 * 10**9  # the pairs' scenes and questions; disjoint from every other seed
TURNS_PER_SCENE = 4
TURNS_PER_PROBE = 2
MAX_NEW_TOKENS = 32  # the longest canonical answer ("a red circle, ... and a blue star") is ~20 tokens


def load(model_dir: Path):
    """Model and processor, loaded offline from the folder like any checkpoint."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    return model.eval(), processor


def scene_examples(scenes: int, describe_style: str = "listed", phrasings: bool = False,
                   exists_pairs: bool = False) -> list[Example]:
    """The held-out scene dialogues; with `phrasings`, every question asked in another form
    (training/phrasings.py; the same scenes and answers); with `exists_pairs`, `exists_pair_examples` instead."""
    if exists_pairs:
        return exists_pair_examples(scenes)
    out = []
    for i in range(scenes):
        scene, turns = eval_dialogue(i, TURNS_PER_SCENE, describe_style)
        if phrasings:
            rng = random.Random(PHRASINGS_SEED_BASE + i)
            turns = [rephrase(t, rng) for t in turns]
        out.append(Example(render_scene(scene), turns, scene))
    return out


def exists_pair_examples(scenes: int) -> list[Example]:
    """Held-out scenes, each asked two "is there" questions with the same answer: both yes for even indices (two
    different kind-and-colour pairs present; scenes with fewer are redrawn), both no for odd ones (hard negatives as
    often as in training, `exists_question`)."""
    out = []
    for i in range(scenes):
        rng = random.Random(EXISTS_PAIRS_SEED_BASE + i)
        scene = generate_scene(rng)
        present = sorted({(s.colour, s.kind) for s in scene.shapes})
        while i % 2 == 0 and len(present) < 2:
            scene = generate_scene(rng)
            present = sorted({(s.colour, s.kind) for s in scene.shapes})
        turns: list[Turn] = []
        for _ in range(2):
            turns.append(exists_question(present, rng, "yes" if i % 2 == 0 else "no", asked=turns))
        out.append(Example(render_scene(scene), turns, scene))
    return out


def probe_examples(probes: int) -> list[Example]:
    return [ood_probe(i, TURNS_PER_PROBE) for i in range(probes)]


def chat_so_far(example: Example, answers: list[str], k: int, teacher_forced: bool = False) -> list[dict]:
    """The chat for turn k: earlier questions with this conversation's own answers (or, teacher-forced, the
    true ones), then question k."""
    if teacher_forced:
        return to_messages(example.image, example.turns[:k + 1], answered=k)
    history = [Turn(t.qtype, t.question, a) for t, a in zip(example.turns, answers)]
    return to_messages(example.image, history + [example.turns[k]], answered=k)


@torch.inference_mode()
def answer_batch(model, processor, chats: list[list[dict]]) -> list[str]:
    """Greedy answers to the last user turn of each chat (batched, left padded)."""
    texts = [processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) for chat in chats]
    images = [[item["image"] for m in chat for item in m["content"] if item["type"] == "image"] for chat in chats]
    processor.tokenizer.padding_side = "left"
    inputs = processor(images=images if any(images) else None, text=texts, padding=True, return_tensors="pt")
    out = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW_TOKENS)
    new_tokens = out[:, inputs["input_ids"].shape[1]:]
    return [t.strip() for t in processor.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]


def answer_with_generate(model, processor, examples: list[Example], batch_size: int = 50,
                         progress: bool = False, teacher_forced: bool = False) -> list[list[str]]:
    """Every turn of every example answered by `generate()`, one batch per turn index."""
    answers: list[list[str]] = [[] for _ in examples]
    for first in range(0, len(examples), batch_size):
        rows = range(first, min(first + batch_size, len(examples)))
        for k in range(max(len(examples[i].turns) for i in rows)):
            live = [i for i in rows if k < len(examples[i].turns)]
            chats = [chat_so_far(examples[i], answers[i], k, teacher_forced) for i in live]
            for i, answer in zip(live, answer_batch(model, processor, chats)):
                answers[i].append(answer)
        if progress:
            print(f"  {rows.stop}/{len(examples)} conversations", flush=True)
    return answers


def score(scenes: list[Example], scene_answers: list[list[str]], probes: list[Example] = (),
          probe_answers: list[list[str]] = ()) -> dict:
    """Exact match per type and turn; refusals of in-domain questions; the refusal rate on probes."""
    right: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # key -> [hits, total]
    failures: list[dict] = []
    for index, (example, answers) in enumerate(zip(scenes, scene_answers)):
        for k, (turn, answer) in enumerate(zip(example.turns, answers)):
            ok = answer == turn.answer
            for key in ("all", f"type:{turn.qtype}", f"turn:{k + 1}"):
                right[key][0] += ok
                right[key][1] += 1
            right["refused"][0] += answer == OOD_REPLY
            right["refused"][1] += 1
            if not ok:
                failures.append({"scene": index, "turn": k + 1, "question": turn.question,
                                 "expected": turn.answer, "got": answer})
    for index, (example, answers) in enumerate(zip(probes, probe_answers)):
        for k, answer in enumerate(answers):
            ok = answer == OOD_REPLY
            for key in ("probe", f"family:{probe_family(index)}"):
                right[key][0] += ok
                right[key][1] += 1
            if not ok:
                failures.append({"probe": index, "family": probe_family(index), "turn": k + 1,
                                 "question": example.turns[k].question, "got": answer})
    ratio = {key: c / n for key, (c, n) in right.items()}
    per_type = {t: ratio[f"type:{t}"] for t in QUESTION_TYPES if f"type:{t}" in ratio}
    return {
        "accuracy": ratio.get("all", 0.0),
        "questions": right["all"][1],
        "min_type_accuracy": min(per_type.values(), default=0.0),
        "per_type": per_type,
        "per_type_count": {t: right[f"type:{t}"][1] for t in QUESTION_TYPES if f"type:{t}" in right},
        "per_turn": {k: ratio[f"turn:{k}"] for k in range(1, TURNS_PER_SCENE + 1) if f"turn:{k}" in ratio},
        "in_domain_refusal_rate": ratio.get("refused", 0.0),
        "ood_reply_rate": ratio.get("probe"),
        "ood_probe_turns": right["probe"][1],
        "per_probe_family": {key.removeprefix("family:"): v for key, v in ratio.items() if key.startswith("family:")},
        "failures": failures,
    }


def evaluate(model, processor, scenes: int, batch_size: int = 50, progress: bool = False, probes: int = 0,
             teacher_forced: bool = False, describe_style: str = "listed", phrasings: bool = False,
             exists_pairs: bool = False) -> dict:
    """Generate-mode report on `scenes` held-out dialogues and `probes` out-of-domain probes."""
    scene_set = scene_examples(scenes, describe_style, phrasings, exists_pairs)
    probe_set = probe_examples(probes)
    answers = answer_with_generate(model, processor, scene_set + probe_set, batch_size, progress, teacher_forced)
    return score(scene_set, answers[:scenes], probe_set, answers[scenes:])


def print_report(report: dict, show_failures: int, scenes: list[Example] | None = None) -> None:
    """The tables, then up to `show_failures` misses; with `scenes` (the scene set asked), each scene miss is
    followed by its scene's geometry (training/miss_geometry.py)."""
    print(f"\n{'question type':<16}{'questions':>10}{'accuracy':>10}")
    for qtype, acc in report["per_type"].items():
        print(f"{qtype:<16}{report['per_type_count'][qtype]:>10}{acc:>10.4f}")
    for k, acc in report["per_turn"].items():
        print(f"{'turn ' + str(k):<16}{'':>10}{acc:>10.4f}")
    print(f"{'overall':<16}{report['questions']:>10}{report['accuracy']:>10.4f}")
    print(f"{'refused (want 0)':<16}{'':>10}{report['in_domain_refusal_rate']:>10.4f}")
    if report["ood_reply_rate"] is not None:
        print(f"\n{'probe family':<16}{'':>10}{'refusal':>10}")
        for family, rate in report["per_probe_family"].items():
            print(f"{family:<16}{'':>10}{rate:>10.4f}")
        print(f"{'all probes':<16}{report['ood_probe_turns']:>10}{report['ood_reply_rate']:>10.4f}")
    for failure in report["failures"][:show_failures]:
        print("  miss:", json.dumps(failure))
        if scenes is not None and "scene" in failure:
            from training.miss_geometry import shape_lines

            for line in shape_lines(scenes[failure["scene"]].scene):
                print("        ", line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--mode", choices=("generate", "engine", "teacher-forced"), default="generate")
    parser.add_argument("--scenes", type=int, default=500)
    parser.add_argument("--probes", type=int, default=140, help="out-of-domain probes (20 per family by default)")
    parser.add_argument("--batch-size", type=int, default=50, help="generate mode: conversations per batch")
    parser.add_argument("--users", type=int, default=16, help="engine mode: conversations in flight at once")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--show-failures", type=int, default=10)
    parser.add_argument("--phrasings", action="store_true",
                        help="ask every scene question in another form (training/phrasings.py): 'what color ...'")
    parser.add_argument("--exists-pairs", action="store_true",
                        help="ask each scene two 'is there' questions with the same answer (read turn 2)")
    parser.add_argument("--explain", action="store_true",
                        help="print each missed scene's shapes: sizes, gaps, twins (training/miss_geometry.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.monotonic()
    style = describe_style_of(args.model)  # the answers to "describe the image." are scored in the model's style
    if args.mode == "engine":
        from training.engine_eval import evaluate_engine

        report = evaluate_engine(args.model, args.scenes, args.probes, args.users, progress=True,
                                 phrasings=args.phrasings, exists_pairs=args.exists_pairs)
    else:
        model, processor = load(args.model)
        report = evaluate(model, processor, args.scenes, args.batch_size, progress=True, probes=args.probes,
                          teacher_forced=args.mode == "teacher-forced", describe_style=style, phrasings=args.phrasings,
                          exists_pairs=args.exists_pairs)
    asked = scene_examples(args.scenes, style, args.phrasings, args.exists_pairs) if args.explain else None
    print_report(report, args.show_failures, asked)
    rate = report["ood_reply_rate"]
    result = {"mode": args.mode, "describe_style": style, "phrasings": args.phrasings,
              "exists_pairs": args.exists_pairs, "accuracy": round(report["accuracy"], 4),
              "min_type_accuracy": round(report["min_type_accuracy"], 4),
              "ood_reply_rate": None if rate is None else round(rate, 4),
              "in_domain_refusal_rate": round(report["in_domain_refusal_rate"], 4),
              "questions": report["questions"], "scenes": args.scenes, "ood_probe_turns": report["ood_probe_turns"],
              "per_type": {k: round(v, 4) for k, v in report["per_type"].items()},
              "per_turn": {k: round(v, 4) for k, v in report["per_turn"].items()},
              "per_probe_family": {k: round(v, 4) for k, v in report["per_probe_family"].items()},
              "seconds": round(time.monotonic() - start, 1)}
    if "engine_stats" in report:  # how the engine served it: batching and session-cache reuse
        stats = report["engine_stats"]
        result["engine"] = {"users": args.users, "mean_batch_occupancy": round(stats["mean_batch_occupancy"], 2),
                            **{k: stats[k] for k in ("session_hits", "session_partial_hits", "session_misses",
                                                     "reused_tokens", "prefill_tokens", "requests_failed")}}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
