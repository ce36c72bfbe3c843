"""Train the demo LFM2-VL from random weights with one command, and save it as a checkpoint folder.

    python -m training.train --recipe demo-present-wide-grouped [--out models/owlet-shapes-vl] [--threads 2]

The recipe (training/recipe.py) fixes the data mix, the step count, the batch, the learning rate and the seed,
so the same command gives the same weights (on the same torch build and thread count). Loss is on assistant
answers only, plus an auxiliary per-image-token loss (`TokenProbe`). AdamW with linear warm-up and a cosine
decay over the recipe's steps. A progress bar shows the loss and the time left; every --log-every steps a JSON
line goes to --log; --save-every writes snapshots <out>-step<N> that `training.eval` can score mid-run.
--steps overrides the recipe's length for a quick smoke run (the schedule then follows the shorter run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from training.demo_model import DEFAULT_MODEL_DIR, build_fresh_model, build_processor
from training.examples import IGNORE, encode_examples
from training.length_groups import causal_lm_loss_sum, label_count, length_groups
from training.recipe import RECIPES, SHIPPED_RECIPE, Recipe, recipe_example
from training.token_targets import GRID, MULTI_LABEL_CLASSES, TARGET_CLASSES, label_targets, token_targets


def learning_rate(progress: float, peak: float, warmup: float = 0.03, floor: float = 0.05) -> float:
    """Linear warm-up over the first `warmup` of training, then cosine down to `floor` x peak."""
    if progress < warmup:
        return peak * max(progress / warmup, 0.01)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, (progress - warmup) / (1 - warmup))))
    return peak * (floor + (1 - floor) * cosine)


def train(recipe: Recipe, out_dir: Path, log_path: Path, log_every: int = 20, threads: int = 2,
          save_every: int = 0) -> dict:
    torch.set_num_threads(threads)
    torch.manual_seed(recipe.seed)
    processor = build_processor(recipe.describe_style)
    model = build_fresh_model(processor, seed=recipe.seed, vision_width=recipe.vision_width,
                              text_layers=recipe.text_layers, vision_layers=recipe.vision_layers)
    model.train()
    aux = TokenProbe(model, recipe.aux_targets)
    params = list(model.named_parameters()) + list(aux.heads.named_parameters())
    decay = [p for n, p in params if p.ndim >= 2]
    no_decay = [p for n, p in params if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=recipe.peak_lr, betas=(0.9, 0.98))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    smoothed = None
    average = WeightAverage(recipe.ema_decay) if recipe.ema_decay else None
    with log_path.open("w") as log, tqdm(total=recipe.steps, unit="step", dynamic_ncols=True, mininterval=5) as bar:
        log.write(json.dumps({"recipe": dataclasses.asdict(recipe), "threads": threads}) + "\n")
        for step in range(recipe.steps):
            lr = learning_rate(step / recipe.steps, recipe.peak_lr)
            for group in optimizer.param_groups:
                group["lr"] = lr
            examples = [recipe_example(recipe, step * recipe.batch_size + i) for i in range(recipe.batch_size)]
            loss, scenes = _answer_loss(model, aux, encode_examples(processor, examples), examples,
                                        recipe.length_groups)
            scale = {key: recipe.target_scale(key, step / recipe.steps) for key in recipe.fading_targets}
            aux_loss = aux.loss(scenes, scale) if scenes else torch.zeros(())
            (loss + recipe.aux_weight * aux_loss).backward()
            torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if average is not None and step >= recipe.ema_start * recipe.steps:
                average.update(model)
            smoothed = loss.item() if smoothed is None else 0.95 * smoothed + 0.05 * loss.item()
            bar.set_postfix(loss=f"{smoothed:.4f}", aux=f"{aux_loss.item():.3f}", lr=f"{lr:.2e}")
            bar.update(1)
            done = step + 1
            if done % log_every == 0 or done == recipe.steps:
                elapsed = time.monotonic() - start
                record = {"step": done, "examples": done * recipe.batch_size, "loss": round(loss.item(), 5),
                          "aux_loss": round(aux_loss.item(), 5), "smoothed_loss": round(smoothed, 5), "lr": lr,
                          "elapsed_s": round(elapsed, 1),
                          "eta_s": round(elapsed / done * (recipe.steps - done), 1)}
                log.write(json.dumps(record) + "\n")
                log.flush()
            if save_every and done % save_every == 0 and done < recipe.steps:  # check a long run while it goes on
                _save(model, processor, out_dir.parent / f"{out_dir.name}-step{done}")
                model.train()
    if average is not None:
        _save(model, processor, out_dir.parent / f"{out_dir.name}-raw")
        average.copy_to(model)
    _save(model, processor, out_dir)
    summary = {"recipe": dataclasses.asdict(recipe), "threads": threads, "steps": recipe.steps,
               "examples": recipe.steps * recipe.batch_size, "final_smoothed_loss": smoothed,
               "minutes": round((time.monotonic() - start) / 60, 1)}
    (out_dir / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _answer_loss(model, aux: "TokenProbe", batch: dict, examples, groups: int) -> tuple[torch.Tensor, list]:
    """Mean next-token loss over the batch's answer tokens, computed in `groups` length groups
    (training/length_groups.py), and the scenes of its pictures in the order the probe saw them."""
    if groups <= 1:
        return model(**batch).loss, [e.scene for e in examples if e.image is not None]
    total, scenes = torch.zeros(()), []
    with aux.collecting():
        for members, part in length_groups(batch, [e.image is not None for e in examples], groups):
            labels = part.pop("labels")
            total = total + causal_lm_loss_sum(model(**part).logits, labels)
            scenes += [examples[i].scene for i in members if examples[i].image is not None]
    return total / max(1, label_count(batch["labels"])), scenes


class TokenProbe:
    """Auxiliary loss: predict facts about each image token from the projector output (training/token_targets.py).

    Each token predicts its own row and column and the recipe's `aux_targets` (any of `TARGET_CLASSES`: the
    kind and colour under it, and for a token on a shape, where that shape is or its centre; or the multi-label
    `MULTI_LABEL_CLASSES`: every kind-and-colour that shows in it). Row and column keep the
    token's place in the image inside its features: the text side cannot read absolute image positions from
    rotary offsets, whose distance to the image varies with the dialogue's length. Pictures that are not scenes
    have no targets (their tokens are ignored). Training-only linear heads on a forward hook; they are not part
    of the saved model.
    """

    def __init__(self, model, targets=("kind", "colour")):
        hidden = model.config.text_config.hidden_size
        every = dict(TARGET_CLASSES, **MULTI_LABEL_CLASSES)
        classes = dict({key: every[key] for key in targets}, row=GRID, col=GRID)
        self.heads = torch.nn.ModuleDict({key: torch.nn.Linear(hidden, n) for key, n in classes.items()})
        self._captured: list[torch.Tensor] = []
        self._collecting = False
        model.model.multi_modal_projector.register_forward_hook(self._capture)

    @contextlib.contextmanager
    def collecting(self):
        """Keep the image tokens of every forward inside the block, in order (a step's length groups); outside
        one, each forward's tokens replace the last's."""
        self._captured, self._collecting = [], True
        try:
            yield
        finally:
            self._collecting = False

    def _capture(self, module, inputs, output):
        tokens = output.reshape(-1, output.shape[-1])
        self._captured = self._captured + [tokens] if self._collecting else [tokens]

    def loss(self, scenes, scale: dict[str, float] | None = None) -> torch.Tensor:
        """`scenes`: one entry per image of the last forward, the Scene it shows or None. `scale` weighs some
        targets (a fading scaffold); a target at weight 0 is left out."""
        if all(scene is None for scene in scenes):
            return torch.zeros(())
        features = torch.cat(self._captured) if self._captured else None
        cells = GRID * GRID
        # The projector sees every image padded to the most tokens an image may have (64 = a 256 px scene).
        assert features is not None and features.shape[0] == cells * len(scenes), "unexpected image tokens"
        scale = scale or {}
        total = torch.zeros(())
        terms = dict(self._class_terms(features, scenes), **self._label_terms(features, scenes))
        for key, term in terms.items():
            weight = scale.get(key, 1.0)
            if weight > 0:
                total = total + (term if key not in scale else weight * term)
        return total

    def _class_terms(self, features: torch.Tensor, scenes) -> dict[str, torch.Tensor]:
        """Cross-entropy of each one-class-per-token head (those with any target in these scenes)."""
        cells = GRID * GRID
        ignore, index = torch.full((cells,), IGNORE), torch.arange(cells)
        keys = [key for key in self.heads if key not in MULTI_LABEL_CLASSES]
        targets: dict[str, list[torch.Tensor]] = {key: [] for key in keys}
        for scene in scenes:
            per_token = dict(token_targets(scene), row=index // GRID, col=index % GRID) if scene is not None else {}
            for key in keys:
                targets[key].append(per_token.get(key, ignore))
        terms = {}
        for key, values in targets.items():
            wanted = torch.cat(values)
            if (wanted != IGNORE).any():  # shapes covering no cell: no "where" or centre targets
                terms[key] = torch.nn.functional.cross_entropy(self.heads[key](features), wanted, ignore_index=IGNORE)
        return terms

    def _label_terms(self, features: torch.Tensor, scenes) -> dict[str, torch.Tensor]:
        """Binary cross-entropy of each multi-label head, summed over its labels and averaged over the tokens of
        scene pictures (other pictures have no targets), so it weighs about as much as one class head."""
        keys = [key for key in self.heads if key in MULTI_LABEL_CLASSES]
        if not keys:
            return {}
        shown = [i for i, scene in enumerate(scenes) if scene is not None]
        tokens = features.view(len(scenes), GRID * GRID, -1)[shown].reshape(-1, features.shape[-1])
        per_scene = [label_targets(scenes[i], keys) for i in shown]
        return {key: torch.nn.functional.binary_cross_entropy_with_logits(
                    self.heads[key](tokens), torch.cat([labels[key] for labels in per_scene]),
                    reduction="none").sum(-1).mean()
                for key in keys}


class WeightAverage:
    """Exponential moving average of a model's parameters (fp32), started from the weights at its first update."""

    def __init__(self, decay: float):
        assert 0.0 < decay < 1.0
        self.decay = decay
        self.shadow: dict[str, torch.Tensor] | None = None

    @torch.no_grad()
    def update(self, model) -> None:
        params = dict(model.named_parameters())
        if self.shadow is None:
            self.shadow = {name: p.detach().clone() for name, p in params.items()}
            return
        for name, p in params.items():
            self.shadow[name].mul_(self.decay).add_(p.detach(), alpha=1.0 - self.decay)

    @torch.no_grad()
    def copy_to(self, model) -> None:
        for name, p in model.named_parameters():
            p.copy_(self.shadow[name])


def _save(model, processor, out_dir: Path) -> None:
    model.eval()
    model.generation_config.max_new_tokens = 32
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", choices=sorted(RECIPES), default=SHIPPED_RECIPE,
                        help="default: the recipe of the shipped weights (models/owlet-shapes-vl/README.md)")
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--steps", type=int, help="override the recipe's step count (smoke runs)")
    parser.add_argument("--log", type=Path, default=Path("artifacts/train_log.jsonl"))
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (1 on a busy machine)")
    parser.add_argument("--save-every", type=int, default=0, help="also save <out>-step<N> snapshots")
    args = parser.parse_args()
    recipe = RECIPES[args.recipe]
    if args.steps:
        recipe = dataclasses.replace(recipe, steps=args.steps)
    summary = train(recipe, args.out, args.log, args.log_every, args.threads, args.save_every)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
