"""Trains an EAGLE-style head on self-distilled data, on the CPU, within a time budget.

Each sequence gives pairs (f_t, x_{t+1}) at positions t; the head's output at t is trained towards the
target's next feature f_{t+1} (smooth L1) and the target's choice label_{t+1} (cross-entropy over the
draft vocabulary). An EAGLE-3 head reads the inputs of several target layers instead of f_t (fused by its fc)
and learns the target's choices only. Training unrolls `steps` drafting steps as in EAGLE-3's training-time test: at
step s the head reads its own step s-1 outputs as features, and its attention sees the true pairs
up to s-1 positions back plus its own chain since then, exactly what it sees when drafting.
"""
from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from ..drafters.eagle3_head import Eagle3Head
from ..drafters.eagle_head import EagleHead


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 3  # drafting steps unrolled per position
    lr: float = 1e-3
    warmup: int = 50
    batch_tokens: int = 4096
    max_len: int = 512  # longest sequence used (longer ones are cut)
    feature_noise: float = 0.05  # uniform noise on input features, as in EAGLE, relative to their RMS
    w_feature: float = 1.0
    w_token: float = 0.1
    step_decay: float = 0.8  # weight of unrolled step s is step_decay ** (s - 1)
    holdout: float = 0.03
    seed: int = 0


def choose_draft_vocab(sequences: list[dict], size: int, vocab_size: int,
                       given: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """The `size` most frequent target choices in the data (or the `given` ids): (token ids ascending, share of
    labels covered)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        counts += torch.bincount(seq["labels"], minlength=vocab_size)
    top = torch.topk(counts, min(size, vocab_size)).indices.sort().values if given is None else given.long()
    return top, float(counts[top].sum() / counts.sum())


def batches(sequences: list[dict], batch_tokens: int, max_len: int, rng: random.Random) -> list[list[dict]]:
    """Groups sequences of similar length into batches of about batch_tokens padded tokens."""
    order = sorted(sequences, key=lambda s: min(len(s["tokens"]), max_len))
    out, cur = [], []
    for seq in order:
        longest = min(len(seq["tokens"]), max_len)  # sorted by length: the newcomer is the longest
        if cur and longest * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(seq)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(group: list[dict], max_len: int):
    """Padded tensors: tokens (B, L), features (B, L-1, H), labels (B, L-1), lengths (B,)."""
    L = max(min(len(s["tokens"]), max_len) for s in group)
    H = group[0]["features"].shape[-1]
    B = len(group)
    tokens = torch.zeros(B, L, dtype=torch.long)
    features = torch.zeros(B, L - 1, H)
    labels = torch.full((B, L - 1), -1, dtype=torch.long)
    lengths = torch.zeros(B, dtype=torch.long)
    for b, s in enumerate(group):
        n = min(len(s["tokens"]), max_len)
        tokens[b, :n] = s["tokens"][:n]
        features[b, : n - 1] = s["features"][: n - 1].float()
        labels[b, : n - 1] = s["labels"][: n - 1]
        lengths[b] = n
    return tokens, features, labels, lengths


def unrolled_mask(n: int, steps: int, device=None) -> torch.Tensor:
    """Attention mask (steps*n, steps*n) bool over keys of all steps, positions 0..n-1 in each.

    Query of step s (1-based) at position p sees step-1 keys at positions <= p - s + 1, and the key of
    step j (2 <= j <= s) at position p - s + j only: the true context, then its own draft chain.
    """
    p = torch.arange(n, device=device)
    mask = torch.zeros(steps, n, steps, n, dtype=torch.bool, device=device)
    for s in range(1, steps + 1):
        mask[s - 1, :, 0, :] = p[None, :] <= (p[:, None] - s + 1)
        for j in range(2, s + 1):
            mask[s - 1, :, j - 1, :] = p[None, :] == (p[:, None] - s + j)
    return mask.view(steps * n, steps * n)


def unrolled_losses(head: EagleHead | Eagle3Head, tokens, features, labels, lengths, cfg: TrainSettings,
                    vocab_index: torch.Tensor, train: bool = True):
    """Per-step losses and top-1 accuracies for one padded batch.

    Pair positions p = 0..n-1 with n = L - 2: step s feeds (its input feature at p, x_{p+1}) and is
    scored against f_{p+1} and label_{p+1}, for p >= s - 1 and p + 1 < length - 1.
    """
    B, L = tokens.shape
    n = L - 2
    pos = torch.arange(n)
    positions = pos[None].expand(B, n)
    true_f = features[:, :n]  # f_p (EAGLE-3: the inputs of its feature layers at p, fused below)
    if train and cfg.feature_noise > 0:
        rms = true_f.pow(2).mean().sqrt()
        true_f = true_f + (torch.rand_like(true_f) * 2 - 1) * cfg.feature_noise * rms
    feat_in = head.fuse(true_f)
    pair_tokens = tokens[:, 1: n + 1]  # x_{p+1} at pair position p, the same at every step
    past, outs = None, []
    mask = unrolled_mask(n, cfg.steps)
    for s in range(1, cfg.steps + 1):
        # step s at position p continues a chain that started from the true pair at p - s + 1;
        # the head's own layer, over the keys of steps 1..s, sees exactly what it sees when drafting
        m = mask[(s - 1) * n: s * n, : s * n]
        out, kv = head(feat_in, pair_tokens, positions, past=past, mask=m | _diag_guard(m))
        past = kv if past is None else (torch.cat([past[0], kv[0]], 2), torch.cat([past[1], kv[1]], 2))
        outs.append(out)
        # the next step, at position p + 1, reads this step's guess of f_{p+1}
        feat_in = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
    losses, accs = [], []
    for s, out in enumerate(outs, start=1):
        shift = s - 1
        valid = (pos[None] >= shift) & (pos[None] + 1 < (lengths[:, None] - 1))
        lab = labels[:, 1: n + 1]
        lab = torch.where(lab >= 0, vocab_index[lab.clamp(min=0)], torch.full_like(lab, -1))
        logits = head.draft_logits(out)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), lab.reshape(-1).clamp(min=0),
                             reduction="none").view(B, n)
        has_label = valid & (lab >= 0)
        loss = (ce * has_label).sum() / has_label.sum().clamp(min=1)
        if head.predicts_features:  # EAGLE-1/2: the output also learns the target's next feature f_{p+1}
            reg = F.smooth_l1_loss(out, features[:, 1: n + 1], reduction="none").mean(-1)
            loss = cfg.w_feature * (reg * valid).sum() / valid.sum().clamp(min=1) + cfg.w_token * loss
        losses.append(loss)
        if not train:
            hit = (logits.argmax(-1) == lab) & has_label
            accs.append((float(hit.sum()), float(valid.sum())))
    return losses, accs


def _diag_guard(mask: torch.Tensor) -> torch.Tensor:
    """Lets a query with no visible key see itself (padding rows), so that softmax never sees only -inf."""
    empty = ~mask.any(-1)
    guard = torch.zeros_like(mask)
    n = mask.shape[0]
    idx = torch.arange(n)
    guard[idx, mask.shape[1] - n + idx] = empty
    return guard


class Trainer:
    """AdamW with warmup and cosine decay over a time budget; checkpoints and resumes (safetensors)."""

    def __init__(self, head: EagleHead, sequences: list[dict], out: Path, settings: TrainSettings,
                 time_budget_s: float, objective=None):
        """objective: (head, tokens, features, labels, lengths, settings, vocab_index, train) -> (losses per
        drafted position, [(hits, trials)] per position when not train); default: the EAGLE head's unrolled
        losses. Any head with draft_ids, trainable_state() and save() trains here (Medusa heads too)."""
        self.head, self.out, self.cfg, self.budget = head, out, settings, time_budget_s
        self.objective = objective or unrolled_losses
        rng = random.Random(settings.seed)
        seqs = [s for s in sequences if len(s["tokens"]) >= 4]
        rng.shuffle(seqs)
        cut = max(1, int(len(seqs) * settings.holdout))
        self.heldout, self.train = seqs[:cut], seqs[cut:]
        self.rng = rng
        vocab = head.config.vocab_size
        self.vocab_index = torch.full((vocab,), -1, dtype=torch.long)
        self.vocab_index[head.draft_ids] = torch.arange(len(head.draft_ids))
        # the frozen tables are read in bfloat16 under autocast anyway: cast them once, not at every product
        for table in ("embed", "draft_lm_head"):
            if getattr(head, table, None) is not None:
                setattr(head, table, getattr(head, table).to(torch.bfloat16))
        params = [p for p in head.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.step, self.elapsed, self.history = 0, 0.0, []

    def lr_at(self) -> float:
        frac = min(1.0, self.elapsed / self.budget)
        warm = min(1.0, (self.step + 1) / self.cfg.warmup)
        return self.cfg.lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))

    def run(self, checkpoint_every_s: float = 300.0, progress: bool = True) -> dict:
        from tqdm.auto import tqdm

        self.resume()
        bar = tqdm(total=int(self.budget), initial=int(self.elapsed), unit="s", desc="train-drafter",
                   disable=not progress, file=sys.stderr)
        last_ckpt, stats = time.time(), {}
        while self.elapsed < self.budget:
            for group in batches(self.train, self.cfg.batch_tokens, self.cfg.max_len, self.rng):
                if self.elapsed >= self.budget:
                    break
                t0 = time.time()
                self.head.train()
                tokens, features, labels, lengths = collate(group, self.cfg.max_len)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    losses, _ = self.objective(self.head, tokens, features, labels, lengths, self.cfg,
                                               self.vocab_index, True)
                loss = sum(l * self.cfg.step_decay ** i for i, l in enumerate(losses))
                for g in self.opt.param_groups:
                    g["lr"] = self.lr_at()
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
                self.opt.step()
                self.step += 1
                dt = time.time() - t0
                self.elapsed += dt
                bar.update(int(self.elapsed) - bar.n)
                if self.step % 20 == 0:
                    bar.set_postfix(loss=f"{float(loss.detach()):.3f}", **stats)
                if time.time() - last_ckpt > checkpoint_every_s:
                    stats = self.evaluate()
                    self.checkpoint(stats)
                    last_ckpt = time.time()
        bar.close()
        stats = self.evaluate()
        self.checkpoint(stats)
        return stats

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out top-1 agreement with the target at each drafted position, and the chain MAT it implies."""
        self.head.eval()
        hits = [0.0] * self.cfg.steps
        total = [0.0] * self.cfg.steps
        for group in batches(self.heldout, self.cfg.batch_tokens, self.cfg.max_len, random.Random(0)):
            tokens, features, labels, lengths = collate(group, self.cfg.max_len)
            _, accs = self.objective(self.head, tokens, features, labels, lengths, self.cfg, self.vocab_index,
                                     False)
            for i, (h, t) in enumerate(accs):
                hits[i] += h
                total[i] += t
        acc = [h / max(t, 1) for h, t in zip(hits, total)]
        mat, reach = 1.0, 1.0
        for a in acc:
            reach *= a
            mat += reach
        stats = {f"acc{i + 1}": round(a, 3) for i, a in enumerate(acc)}
        stats["chain_mat"] = round(mat, 3)
        self.history.append({"step": self.step, "elapsed_s": round(self.elapsed, 1), **stats})
        return stats

    # ---- checkpoints --------------------------------------------------------------------------------
    def checkpoint(self, stats: dict) -> None:
        state = {f"param.{k}": v.detach().float().contiguous() for k, v in self.head.trainable_state().items()}
        for i, (p, s) in enumerate(self._param_states()):
            for key in ("exp_avg", "exp_avg_sq"):
                if key in s:
                    state[f"opt.{i}.{key}"] = s[key].contiguous()
        ckpt = self.out / "checkpoint"
        ckpt.mkdir(parents=True, exist_ok=True)
        save_file(state, str(ckpt / "state.safetensors"))
        (ckpt / "state.json").write_text(json.dumps({"step": self.step, "elapsed": self.elapsed,
                                                     "history": self.history, "settings": asdict(self.cfg),
                                                     "opt_steps": [int(s.get("step", 0)) for _, s in self._param_states()]}))
        self.head.save(self.out, extra={"settings": asdict(self.cfg), "history": self.history, "steps": self.step,
                                        "train_seconds": round(self.elapsed, 1)})

    def resume(self) -> None:
        ckpt = self.out / "checkpoint"
        if not (ckpt / "state.json").is_file():
            return
        meta = json.loads((ckpt / "state.json").read_text())
        state = load_file(str(ckpt / "state.safetensors"))
        self.head.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("param.")})
        params = [p for p in self.head.parameters() if p.requires_grad]
        for i, p in enumerate(params):
            if f"opt.{i}.exp_avg" in state:
                self.opt.state[p] = {"step": torch.tensor(float(meta["opt_steps"][i])),
                                     "exp_avg": state[f"opt.{i}.exp_avg"], "exp_avg_sq": state[f"opt.{i}.exp_avg_sq"]}
        self.step, self.elapsed, self.history = meta["step"], meta["elapsed"], meta["history"]
        print(f"specdec: resumed training at step {self.step} ({self.elapsed:.0f}s done)", file=sys.stderr)

    def _param_states(self):
        params = [p for p in self.head.parameters() if p.requires_grad]
        return [(p, self.opt.state.get(p, {})) for p in params]
