"""Reading an EAGLE-3 head from its folder (eagle3_head.py has the head and its file layout): specdec's own heads,
checked against their target's fingerprint, and heads in their authors' layout (SafeAILab/EAGLE, SpecForge),
checked on their sizes."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...errors import IncompatibleDraftError, ModelLoadError
from .eagle3_head import (
    CONFIG_FILE,
    KEYS,
    WEIGHTS_FILE,
    Eagle3Config,
    Eagle3Head,
    config_for_target,
    feature_layers_of,
)
from .eagle_head import frozen_parts


def is_eagle3_folder(folder: str | Path) -> bool:
    """Whether folder/config.json describes an EAGLE-3 head (its architecture, or a draft vocabulary with the
    authors' aux-layer setting)."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        return False
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return False
    return "Eagle3" in " ".join(data.get("architectures") or []) or "eagle_config" in data


def load_eagle3_head(folder: str | Path, target) -> Eagle3Head:
    """An EAGLE-3 head (specdec's or its authors' layout) onto the target (a LoadedModel). A specdec head is
    refused on any other target; one from elsewhere must match the target's sizes."""
    from ...files import read_tensors, tensor_names_problem

    from .eagle_published import PICKLE_FILE, rope_frequencies

    folder = Path(folder)
    data = json.loads((folder / CONFIG_FILE).read_text())
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        if (folder / PICKLE_FILE).is_file():
            raise ModelLoadError(
                f"{folder} holds the EAGLE-3 head as a pickle ({PICKLE_FILE}), which specdec does "
                f"not load: convert it to {WEIGHTS_FILE} once (docs/training.md shows how)"
            )
        raise ModelLoadError(f"{folder} holds an EAGLE-3 config.json but no {WEIGHTS_FILE}")
    hf_model = target.hf_model
    mine = config_for_target(hf_model, target.name, data.get("draft_vocab_size") or data.get("vocab_size", 0))
    own = data.get("specdec") or {}
    if own.get("target_fingerprint") and own["target_fingerprint"] != mine.target_fingerprint:
        raise IncompatibleDraftError(
            f"the EAGLE-3 head in {folder} was trained for target {own.get('target')!r} "
            f"(fingerprint {own['target_fingerprint']}), not for {target.name!r} "
            f"({mine.target_fingerprint})"
        )
    layers = feature_layers_of(data, target.info.num_layers)
    for what, theirs, want in (
        ("hidden size", data.get("hidden_size"), mine.hidden_size),
        ("target hidden size", data.get("target_hidden_size", mine.hidden_size), mine.hidden_size),
        ("vocabulary size", data.get("vocab_size"), mine.vocab_size),
    ):
        if theirs != want:
            raise IncompatibleDraftError(
                f"the EAGLE-3 head in {folder} has {what} {theirs}, but {target.name!r} has {want}"
            )
    if data.get("num_hidden_layers", 1) != 1 or data.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(
            f"{folder / CONFIG_FILE} describes a head of {data.get('num_hidden_layers')} layers "
            f"with activation {data.get('hidden_act')!r}; specdec reads EAGLE-3 heads of one layer "
            f"with 'silu'"
        )
    bad = [i for i in layers if not 0 <= int(i) < target.info.num_layers]
    if bad:
        raise IncompatibleDraftError(
            f"the EAGLE-3 head in {folder} reads target layer {bad[0]}, but "
            f"{target.name!r} has {target.info.num_layers} layers"
        )
    heads = data.get("num_attention_heads", mine.num_heads)
    config = Eagle3Config(
        target=own.get("target"),
        target_fingerprint=own.get("target_fingerprint"),
        hidden_size=mine.hidden_size,
        num_heads=heads,
        num_kv_heads=data.get("num_key_value_heads") or heads,
        head_dim=data.get("head_dim") or mine.hidden_size // heads,
        intermediate_size=data.get("intermediate_size", mine.intermediate_size),
        rms_norm_eps=data.get("rms_norm_eps", 1e-6),
        vocab_size=mine.vocab_size,
        draft_vocab_size=mine.draft_vocab_size,
        feature_layers=tuple(int(i) for i in layers),
        fc_bias=bool(data.get("bias", False)),
    )
    tensors = read_tensors(weights, "the EAGLE-3 head")
    d2t = tensors.pop("d2t", None)
    tensors.pop("t2d", None)
    embed_copy = tensors.pop("embed_tokens.weight", None)
    embed, _, _, target_inv_freq = frozen_parts(hf_model, None)
    if embed_copy is not None and embed_copy.shape != embed.shape:
        raise IncompatibleDraftError(
            f"the EAGLE-3 head in {folder} holds an embedding of shape "
            f"{tuple(embed_copy.shape)}, but {target.name!r} has {tuple(embed.shape)}"
        )
    K = config.draft_vocab_size
    draft_ids = torch.arange(K) + (d2t.long() if d2t is not None else 0)
    if d2t is None and K != config.vocab_size:
        raise ModelLoadError(
            f"{weights} has a draft vocabulary of {K} tokens but no d2t table mapping it to the target's"
        )
    if draft_ids.numel() != K or int(draft_ids.min()) < 0 or int(draft_ids.max()) >= config.vocab_size:
        raise ModelLoadError(f"{weights}: its d2t table does not map {K} draft tokens into the target's vocabulary")
    problem = tensor_names_problem(tensors, KEYS, () if config.fc_bias else ("fc.bias",))
    if problem:
        raise ModelLoadError(f"{weights} is not an EAGLE-3 head in its authors' layout: {problem}")
    inv_freq = target_inv_freq if own else rope_frequencies(data, config.head_dim, folder)
    head = Eagle3Head(config, embed, draft_ids, inv_freq)
    try:
        head.load_state_dict({KEYS[k]: v.float() for k, v in tensors.items()})
    except RuntimeError as e:
        raise IncompatibleDraftError(
            f"the EAGLE-3 head in {folder} does not fit its own config.json: {str(e).splitlines()[-1].strip()}"
        ) from None
    return head.eval()
