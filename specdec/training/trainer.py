"""Trains a draft head within a time budget on 2 CPU cores, for hours, across interruptions.

Resuming is exact: the checkpoint (one safetensors file, written atomically) holds the weights, AdamW's moments,
the torch RNG state (feature noise), the position in the epoch (batch order is a function of the seed and the
epoch) and the planned number of steps. The learning rate is a function of the step: warmup, flat, then a linear
decay over the last (1 - decay_from) of the planned steps, which are planned from the time budget once the first
steps are timed. Stopping and resuming gives the same weights as an uninterrupted run with the same plan.

Held-out agreement with the target at each draft depth is measured at every evaluation, against the answer tokens
seen so far: the learning curve (history in the checkpoint and the head's config, and learning_curve.png).
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import ConfigError
from ..files import write_atomic
from ..models.devices import cpu_has_bf16
from .batching import TrainSettings, batches, collate
from .datamix import repeat_families
from .eagle_trainer import unrolled_losses
from .heldout import draft_vocab_index, heldout_agreement, plot_learning_curve, split_heldout

CHECKPOINT = "checkpoint.safetensors"


class Trainer:
    """AdamW with warmup, a flat phase and a final decay; checkpoints and resumes exactly (safetensors)."""

    def __init__(
        self,
        head,
        sequences: list[dict],
        out: Path,
        settings: TrainSettings,
        time_budget_s: float,
        objective=None,
        max_steps: int | None = None,
        repeats: dict[str, int] | None = None,
    ):
        """objective: (head, Batch, settings, vocab_index, train) -> (losses per drafted position, [(hits,
        trials)] per position when not train); default: the EAGLE head's unrolled losses. Any head with
        draft_ids, trainable_state() and save() trains here (Medusa heads too). max_steps: plan and stop at this
        many steps instead of planning from the time budget. repeats: {source family: N}, its training sequences N
        times in each epoch (datamix.repeat_families; the held-out ones once)."""
        self.head, self.out, self.cfg, self.budget = head, Path(out), settings, time_budget_s
        self.objective = objective or unrolled_losses
        self.max_steps = max_steps
        self.train, self.heldout = split_heldout(sequences, settings)
        self.repeats = dict(repeats or {})
        self.train = repeat_families(self.train, self.repeats)
        if not self.train:
            raise ConfigError("no training sequences left after holding some out; give more data")
        self.vocab_index = draft_vocab_index(head)
        # bfloat16 autocast where the CPU multiplies bfloat16 natively; elsewhere (AVX2) it is emulated, several
        # times slower than float32, so training stays in float32 there
        self.bf16 = cpu_has_bf16()
        if self.bf16:  # the frozen tables are read in bfloat16 under autocast anyway: cast them once
            for table in ("embed", "draft_lm_head"):
                if getattr(head, table, None) is not None:
                    setattr(head, table, getattr(head, table).to(torch.bfloat16))
        self.params = [p for p in head.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.step, self.elapsed, self.tokens_seen = 0, 0.0, 0
        self.history: list[dict] = []
        self.epoch, self.batch_in_epoch = 0, 0
        self.planned_steps = max_steps

    def lr_at(self) -> float:
        warm = min(1.0, (self.step + 1) / self.cfg.warmup)
        if not self.planned_steps:
            return self.cfg.lr * warm
        start = self.cfg.decay_from * self.planned_steps
        left = max(0.0, (self.planned_steps - self.step) / max(1.0, self.planned_steps - start))
        return self.cfg.lr * warm * (0.05 + 0.95 * min(1.0, left))

    def epoch_batches(self) -> list[list[dict]]:
        return batches(
            self.train, self.cfg.batch_tokens, self.cfg.max_len, random.Random(self.cfg.seed * 1_000_003 + self.epoch)
        )

    def run(
        self,
        checkpoint_every_s: float = 300.0,
        evaluate_every_s: float = 900.0,
        progress: bool = True,
        stop_after: int | None = None,
    ) -> dict:
        """Trains until the budget (or max_steps) is spent; stop_after: stop after this many steps in this call
        (as an interruption would)."""
        from tqdm.auto import tqdm

        self.resume()
        bar = tqdm(
            total=int(self.budget),
            initial=int(min(self.elapsed, self.budget)),
            unit="s",
            desc="train-drafter",
            disable=not progress,
            file=sys.stderr,
        )
        last_ckpt = last_eval = time.time()
        run_steps = 0
        stats: dict[str, float] = {}
        while not self._done():
            order = self.epoch_batches()
            while self.batch_in_epoch < len(order) and not self._done():
                if stop_after is not None and run_steps >= stop_after:
                    bar.close()
                    return stats
                loss = self._train_step(order[self.batch_in_epoch])
                self.batch_in_epoch += 1
                run_steps += 1
                if self.planned_steps is None and run_steps == 20:
                    self.planned_steps = int(self.step + (self.budget - self.elapsed) * self.step / self.elapsed)
                bar.update(int(min(self.elapsed, self.budget)) - bar.n)
                if self.step % 20 == 0:
                    bar.set_postfix(loss=f"{loss:.3f}", **stats)
                if time.time() - last_eval > evaluate_every_s:
                    stats, last_eval = self.evaluate(), time.time()
                if time.time() - last_ckpt > checkpoint_every_s:
                    self.checkpoint(stats)
                    last_ckpt = time.time()
            if self.batch_in_epoch >= len(order):
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        bar.close()
        stats = self.evaluate()
        self.checkpoint(stats)
        return stats

    def _done(self) -> bool:
        return self.step >= self.max_steps if self.max_steps is not None else self.elapsed >= self.budget

    def _train_step(self, group: list[dict]) -> float:
        t0 = time.time()
        self.head.train()
        batch = collate(group, self.cfg.max_len)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            losses, _ = self.objective(self.head, batch, self.cfg, self.vocab_index, True)
        loss = sum(l * self.cfg.step_decay**i for i, l in enumerate(losses))
        for g in self.opt.param_groups:
            g["lr"] = self.lr_at()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.step += 1
        self.tokens_seen += int(batch.trainable.sum())
        self.elapsed += time.time() - t0
        return float(loss.detach())

    def evaluate(self) -> dict:
        """Held-out agreement now (`heldout_agreement`), appended to the learning curve."""
        stats = heldout_agreement(self.head, self.heldout, self.cfg, self.vocab_index, self.objective)
        self.history.append(
            {"step": self.step, "tokens_seen": self.tokens_seen, "elapsed_s": round(self.elapsed, 1), **stats}
        )
        return stats

    # ---- checkpoints --------------------------------------------------------------------------------
    def checkpoint(self, stats: dict) -> None:
        """The resumable state (one file, written atomically), the head itself, and the learning curve."""
        state = {f"param.{i}": p.detach().float().contiguous() for i, p in enumerate(self.params)}
        for i, p in enumerate(self.params):
            for key in ("exp_avg", "exp_avg_sq"):
                if key in self.opt.state.get(p, {}):
                    state[f"opt.{i}.{key}"] = self.opt.state[p][key].contiguous()
        state["rng"] = torch.get_rng_state()
        meta = {
            "step": self.step,
            "elapsed": self.elapsed,
            "tokens_seen": self.tokens_seen,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "planned_steps": self.planned_steps,
            "budget": self.budget,
            "history": self.history,
            "settings": asdict(self.cfg),
            "repeats": self.repeats,
            "opt_steps": [int(self.opt.state.get(p, {}).get("step", 0)) for p in self.params],
        }
        self.out.mkdir(parents=True, exist_ok=True)
        write_atomic(self.out / CHECKPOINT, lambda tmp: save_file(state, str(tmp), metadata={"json": json.dumps(meta)}))
        self.head.save(
            self.out,
            extra={
                "settings": asdict(self.cfg),
                "history": self.history,
                "steps": self.step,
                "tokens_seen": self.tokens_seen,
                "train_seconds": round(self.elapsed, 1),
            },
        )
        plot_learning_curve(self.history, self.out / "learning_curve.png")

    def resume(self) -> None:
        path = self.out / CHECKPOINT
        if not path.is_file():
            return
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads(f.metadata()["json"])
            state = {k: f.get_tensor(k) for k in f.keys()}
        if meta["settings"] != asdict(self.cfg):
            raise ConfigError(
                f"{path} was made with other training settings ({meta['settings']}); train into "
                f"another --out, or use the same settings"
            )
        if meta.get("repeats", {}) != self.repeats:
            raise ConfigError(
                f"{path} was trained with --repeat-source {meta.get('repeats', {})}; train into another "
                f"--out, or repeat the same sources"
            )
        for i, p in enumerate(self.params):
            p.data.copy_(state[f"param.{i}"])
            if f"opt.{i}.exp_avg" in state:
                self.opt.state[p] = {
                    "step": torch.tensor(float(meta["opt_steps"][i])),
                    "exp_avg": state[f"opt.{i}.exp_avg"],
                    "exp_avg_sq": state[f"opt.{i}.exp_avg_sq"],
                }
        torch.set_rng_state(state["rng"])
        for key in ("step", "elapsed", "tokens_seen", "epoch", "batch_in_epoch", "history"):
            setattr(self, key, meta[key])
        self.planned_steps = self.max_steps or meta["planned_steps"]
        if self.max_steps is None and meta["budget"] != self.budget and self.step:  # a new budget: plan again
            self.planned_steps = int(self.step + (self.budget - self.elapsed) * self.step / max(self.elapsed, 1e-9))
        print(f"specdec: resumed training at step {self.step} ({self.elapsed:.0f}s done)", file=sys.stderr)
