"""Medusa heads: small residual blocks on the target's last hidden state, head d guessing the token d places
after the next one.

At position t the target's final hidden state f_t (the LM head's input, (H,)) gives the target's own next
token x_{t+1}. Head d (1-based) runs f_t through its residual blocks (x + SiLU(W x + b)) and an LM head, and
guesses x_{t+1+d}, without reading the tokens in between: all heads draft in one pass (Cai et al. 2024).

Two layouts load:
- specdec's (`medusa_heads.safetensors` + `medusa_config.json`, from `specdec train-drafter --kind medusa`):
  the heads share the target's frozen LM head, restricted to a draft vocabulary of frequent tokens, so the file
  holds only the blocks; the config names the target and a fingerprint of its embeddings.
- Medusa's own (FasterDecoding: `medusa_lm_head.safetensors` + `config.json` with `medusa_num_heads` and
  `medusa_num_layers`; vLLM's key names are read too): every head has its own LM head over the full vocabulary.
  These name no fingerprint, so only their sizes are checked against the target.
"""

from __future__ import annotations

import json
import re
from typing import cast
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import IncompatibleDraftError, ModelLoadError
from .eagle_head import target_fingerprint

HEADS_FILE, CONFIG_FILE = "medusa_heads.safetensors", "medusa_config.json"
MEDUSA_WEIGHTS, MEDUSA_CONFIG = "medusa_lm_head.safetensors", "config.json"  # Medusa's (FasterDecoding) layout


@dataclass(frozen=True)
class MedusaConfig:
    target: str  # the target's name when trained (or the base model a Medusa file names)
    target_fingerprint: str | None  # a hash of the target's embedding table; None for files from other tools
    hidden_size: int
    num_heads: int  # tokens drafted ahead, one per head
    num_layers: int  # residual blocks per head
    vocab_size: int  # the target's
    draft_vocab_size: int | None  # K rows of the target's frozen LM head the heads share; None: own LM heads

    @property
    def shares_lm_head(self) -> bool:
        return self.draft_vocab_size is not None


class ResBlock(nn.Module):
    """x + SiLU(W x + b), Medusa's block (W starts at zero: a fresh head is the target's LM head on f_t)."""

    def __init__(self, size: int):
        super().__init__()
        self.linear = nn.Linear(size, size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """`heads[d]`: the residual blocks of head d, then (own LM heads only) its LM head over the full vocabulary."""

    draft_ids: torch.Tensor  # (K,) draft index -> token id (a buffer)
    draft_lm_head: torch.Tensor | None  # (K, H) the shared draft LM head (a buffer), where the heads share one

    def __init__(
        self, config: MedusaConfig, lm_head: torch.Tensor | None = None, draft_ids: torch.Tensor | None = None
    ):
        """lm_head (V, H) and draft_ids (K,): the target's LM head and the shared draft vocabulary, when
        config.shares_lm_head."""
        super().__init__()
        c = self.config = config
        own = 0 if c.shares_lm_head else 1  # an LM head per Medusa head
        self.heads = nn.ModuleList(
            nn.Sequential(
                *[ResBlock(c.hidden_size) for _ in range(c.num_layers)],
                *[nn.Linear(c.hidden_size, c.vocab_size, bias=False) for _ in range(own)],
            )
            for _ in range(c.num_heads)
        )
        if c.shares_lm_head:
            assert lm_head is not None and draft_ids is not None  # heads that share the target's LM head get it
            self.register_buffer("draft_lm_head", lm_head.detach()[draft_ids], persistent=False)  # (K, H)
            self.register_buffer("draft_ids", draft_ids.long(), persistent=False)  # (K,) draft index -> token id
        else:
            self.draft_lm_head = None
            self.register_buffer("draft_ids", torch.arange(c.vocab_size), persistent=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features (..., H) -> each head's hidden state (..., heads, H), before the LM head."""
        blocks = self.config.num_layers
        return torch.stack([head[:blocks](features) for head in self.sequences], dim=-2)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., heads, H) -> logits over the draft vocabulary (..., heads, K)."""
        if self.draft_lm_head is not None:
            return hidden @ self.draft_lm_head.to(hidden.dtype).T
        blocks = self.config.num_layers
        return torch.stack([head[blocks](hidden[..., d, :]) for d, head in enumerate(self.sequences)], dim=-2)

    @property
    def sequences(self) -> list[nn.Sequential]:
        """Each head's blocks (and own LM head), as the nn.Sequential it is."""
        return [cast(nn.Sequential, head) for head in self.heads]

    def blocks_of(self, d: int) -> list[ResBlock]:
        """Head d's residual blocks."""
        return [cast(ResBlock, block) for block in list(self.sequences[d])[: self.config.num_layers]]

    @property
    def feature_dtype(self) -> torch.dtype:
        return self.blocks_of(0)[0].linear.weight.dtype

    # ---- files ------------------------------------------------------------------------------------
    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().contiguous() for k, v in self.state_dict().items()}

    def save(self, folder: Path, dtype: torch.dtype = torch.bfloat16, extra: dict | None = None) -> None:
        from safetensors.torch import save_file

        from ...files import write_atomic, write_text_atomic

        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.to(dtype) for k, v in self.trainable_state().items()}
        if self.config.shares_lm_head:
            tensors["draft_ids"] = self.draft_ids.to(torch.int64).contiguous()
        write_atomic(
            folder / HEADS_FILE, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "specdec-medusa-heads"})
        )
        data = asdict(self.config)
        if extra:
            data["training"] = extra
        write_text_atomic(folder / CONFIG_FILE, json.dumps(data, indent=1))


def new_medusa_heads(
    hf_model, name: str, draft_ids: torch.Tensor, num_heads: int = 4, num_layers: int = 1
) -> MedusaHeads:
    """Fresh heads for this target sharing its LM head over `draft_ids` (each starts as the LM head on f_t)."""
    config = MedusaConfig(
        target=name,
        target_fingerprint=target_fingerprint(hf_model.get_input_embeddings().weight),
        hidden_size=hf_model.config.hidden_size,
        num_heads=num_heads,
        num_layers=num_layers,
        vocab_size=hf_model.get_output_embeddings().weight.shape[0],
        draft_vocab_size=len(draft_ids),
    )
    return MedusaHeads(config, _lm_head(hf_model), draft_ids)


def load_medusa_heads(folder: str | Path, target) -> MedusaHeads:
    """Loads Medusa heads onto their target (a LoadedModel), from either layout; refuses another target's."""
    from ...files import read_tensors

    folder = Path(folder)
    if (folder / HEADS_FILE).is_file() and (folder / CONFIG_FILE).is_file():
        data = json.loads((folder / CONFIG_FILE).read_text())
        data.pop("training", None)
        config = MedusaConfig(**data)
        mine = target_fingerprint(target.hf_model.get_input_embeddings().weight)
        if mine != config.target_fingerprint:
            raise IncompatibleDraftError(
                f"the Medusa heads in {folder} were trained for target {config.target!r} "
                f"(fingerprint {config.target_fingerprint}), not for {target.name!r} ({mine})"
            )
        tensors = read_tensors(folder / HEADS_FILE, "the Medusa heads")
        heads = MedusaHeads(config, _lm_head(target.hf_model), tensors.pop("draft_ids"))
    elif (folder / MEDUSA_WEIGHTS).is_file():
        config = _medusa_config(folder, target)
        tensors = _medusa_state(read_tensors(folder / MEDUSA_WEIGHTS, "the Medusa heads"), config.num_layers)
        heads = MedusaHeads(config)
    elif (folder / "medusa_lm_head.pt").is_file():
        raise ModelLoadError(
            f"{folder} holds Medusa heads as a pickle (medusa_lm_head.pt), which specdec does not "
            f"load: convert them to {MEDUSA_WEIGHTS} (safetensors)"
        )
    else:
        raise ModelLoadError(
            f"{folder} holds no Medusa heads ({HEADS_FILE} + {CONFIG_FILE}, or {MEDUSA_WEIGHTS} + {MEDUSA_CONFIG})"
        )
    try:
        heads.load_state_dict({k: v.float() for k, v in tensors.items()})
    except RuntimeError as e:
        raise IncompatibleDraftError(
            f"the Medusa heads in {folder} do not fit {target.name!r}: {str(e).splitlines()[-1].strip()}"
        ) from None
    return heads.eval()


def _medusa_config(folder: Path, target) -> MedusaConfig:
    """The config of a Medusa-layout folder, checked against the target's sizes."""
    path = folder / MEDUSA_CONFIG
    data = json.loads(path.read_text()) if path.is_file() else {}
    heads = data.get("medusa_num_heads", data.get("num_heads"))
    layers = data.get("medusa_num_layers", data.get("num_hidden_layers"))
    if not isinstance(heads, int) or not isinstance(layers, int) or heads < 1 or layers < 0:
        raise ModelLoadError(f"{path} must give medusa_num_heads (>= 1) and medusa_num_layers (>= 0)")
    info = target.info
    for key, mine in (("hidden_size", info.hidden_size), ("vocab_size", info.vocab_size)):
        if key in data and data[key] != mine:
            raise IncompatibleDraftError(
                f"the Medusa heads in {folder} have {key} {data[key]}; {target.name!r} has {mine}"
            )
    if data.get("truncated_vocab_size") not in (None, info.vocab_size):
        raise IncompatibleDraftError(
            f"the Medusa heads in {folder} use a truncated vocabulary, which specdec does not read"
        )
    return MedusaConfig(
        target=str(data.get("base_model_name_or_path", folder)),
        target_fingerprint=None,
        hidden_size=info.hidden_size,
        num_heads=heads,
        num_layers=layers,
        vocab_size=info.vocab_size,
        draft_vocab_size=None,
    )


def _medusa_state(tensors: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """Medusa's keys ("0.0.linear.weight", "0.1.weight"; vLLM's "blocks.0.layers.0.weight", "lm_heads.0.weight")
    as this module's ("heads.0.0.linear.weight", "heads.0.1.weight")."""
    out = {}
    for key, value in tensors.items():
        if m := re.fullmatch(r"blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)", key):
            key = f"{m[1]}.{m[2]}.linear.{m[3]}"
        elif m := re.fullmatch(r"lm_heads\.(\d+)\.weight", key):
            key = f"{m[1]}.{layers}.weight"
        out["heads." + key] = value
    return out


def _lm_head(hf_model) -> torch.Tensor:
    return hf_model.get_output_embeddings().weight.detach().float().cpu()
