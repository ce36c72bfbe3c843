"""Train the demo LFM2-VL on synthetic shape dialogues and save it as a checkpoint folder.

    python -m training.train --minutes 30 --out models/owlet-shapes-vl

Loss is on assistant answers only. AdamW with warm-up and a cosine decay; the schedule follows
training progress, which is steps done / --steps, or time spent / --minutes when only a time budget is given.
A progress bar shows the loss; every --log-every steps a JSON line goes to --log.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from training.demo_model import DEFAULT_MODEL_DIR, build_fresh_model, build_processor
from training.examples import encode_batch, training_dialogue
from training.scenes import COLOUR_NAMES, SHAPES
from training.token_targets import GRID, token_targets


def learning_rate(progress: float, peak: float, warmup: float = 0.03, floor: float = 0.05) -> float:
    """Linear warm-up over the first `warmup` of training, then cosine down to `floor` x peak."""
    if progress < warmup:
        return peak * max(progress / warmup, 0.01)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, (progress - warmup) / (1 - warmup))))
    return peak * (floor + (1 - floor) * cosine)


def train(out_dir: Path, steps: int | None, minutes: float | None, batch_size: int, peak_lr: float,
          log_path: Path, log_every: int, threads: int, seed: int, save_every: int = 0,
          init: Path | None = None, first_example: int = 0, aux_weight: float = 0.0) -> dict:
    assert steps or minutes, "give --steps or --minutes"
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    if init:  # continue from a saved checkpoint (a new schedule; optimizer moments start afresh)
        from transformers import AutoProcessor, Lfm2VlForConditionalGeneration

        processor = AutoProcessor.from_pretrained(init, local_files_only=True)
        model = Lfm2VlForConditionalGeneration.from_pretrained(init, dtype=torch.float32, local_files_only=True)
    else:
        processor = build_processor()
        model = build_fresh_model(processor, seed=seed)
    model.train()
    aux = TokenProbe(model) if aux_weight > 0 else None
    params = list(model.named_parameters()) + (list(aux.heads.named_parameters()) if aux else [])
    decay = [p for n, p in params if p.ndim >= 2]
    no_decay = [p for n, p in params if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=peak_lr, betas=(0.9, 0.98))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("w")
    start = time.monotonic()
    bar = tqdm(total=steps or int(minutes * 60), unit="step" if steps else "s", dynamic_ncols=True, mininterval=5)
    step, smoothed = 0, None
    while True:
        elapsed = time.monotonic() - start
        progress = step / steps if steps else elapsed / (minutes * 60)
        if progress >= 1.0:
            break
        lr = learning_rate(progress, peak_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        dialogues = [training_dialogue(first_example + step * batch_size + i) for i in range(batch_size)]
        batch = encode_batch(processor, dialogues)
        loss = model(**batch).loss
        aux_loss = aux.loss([scene for scene, _ in dialogues]) if aux else torch.zeros(())
        (loss + aux_weight * aux_loss).backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        smoothed = loss.item() if smoothed is None else 0.95 * smoothed + 0.05 * loss.item()
        bar.set_postfix(loss=f"{smoothed:.4f}", lr=f"{lr:.2e}")
        bar.update(1 if steps else int(time.monotonic() - start) - bar.n)
        if step % log_every == 0:
            record = {"step": step, "examples": step * batch_size, "loss": round(loss.item(), 5), "aux_loss": round(aux_loss.item(), 5),
                      "smoothed_loss": round(smoothed, 5), "lr": lr, "elapsed_s": round(time.monotonic() - start, 1)}
            log.write(json.dumps(record) + "\n")
            log.flush()
        if save_every and step % save_every == 0:  # snapshots let a long run be checked while it goes on
            _save(model, processor, out_dir.parent / f"{out_dir.name}-step{step}")
            model.train()
    bar.close()
    log.close()
    _save(model, processor, out_dir)
    summary = {"steps": step, "examples": step * batch_size, "final_smoothed_loss": smoothed,
               "minutes": round((time.monotonic() - start) / 60, 1), "batch_size": batch_size, "peak_lr": peak_lr}
    (out_dir / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


class TokenProbe:
    """Auxiliary loss: predict each image token's shape kind, colour, row and column from the projector output.

    Row and column keep the token's place in the image inside its features: the text side cannot read absolute
    image positions from rotary offsets, whose distance to the image varies with the dialogue's length.
    Training-only linear heads on a forward hook; they are not part of the saved model.
    """

    def __init__(self, model):
        hidden = model.config.text_config.hidden_size
        self.heads = torch.nn.ModuleDict({"kind": torch.nn.Linear(hidden, len(SHAPES) + 1),
                                          "colour": torch.nn.Linear(hidden, len(COLOUR_NAMES) + 1),
                                          "row": torch.nn.Linear(hidden, GRID), "col": torch.nn.Linear(hidden, GRID)})
        self._features = None
        model.model.multi_modal_projector.register_forward_hook(self._capture)

    def _capture(self, module, inputs, output):
        self._features = output.reshape(-1, output.shape[-1])

    def loss(self, scenes) -> torch.Tensor:
        kinds, colours = zip(*(token_targets(scene) for scene in scenes))
        features = self._features
        assert features is not None and features.shape[0] == GRID * GRID * len(scenes), "unexpected image tokens"
        ce = torch.nn.functional.cross_entropy
        cells = torch.arange(GRID * GRID).repeat(len(scenes))
        return (ce(self.heads["kind"](features), torch.cat(kinds)) + ce(self.heads["colour"](features), torch.cat(colours))
                + ce(self.heads["row"](features), cells // GRID) + ce(self.heads["col"](features), cells % GRID))


def _save(model, processor, out_dir: Path) -> None:
    model.eval()
    model.generation_config.max_new_tokens = 32
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--steps", type=int, help="number of optimizer steps")
    parser.add_argument("--minutes", type=float, help="time budget (used when --steps is not given)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--log", type=Path, default=Path("artifacts/train_log.jsonl"))
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", type=Path, help="start from this checkpoint folder instead of random weights")
    parser.add_argument("--first-example", type=int, default=0,
                        help="index of the first training dialogue (continue past the examples already seen)")
    parser.add_argument("--aux-weight", type=float, default=0.5,
                        help="weight of the per-image-token shape/colour loss (0 turns it off)")
    parser.add_argument("--save-every", type=int, default=0, help="also save <out>-step<N> snapshots")
    args = parser.parse_args()
    if not args.steps and not args.minutes:
        args.minutes = 30.0
    summary = train(args.out, args.steps, args.minutes, args.batch_size, args.lr, args.log, args.log_every,
                    args.threads, args.seed, args.save_every, args.init, args.first_example, args.aux_weight)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
