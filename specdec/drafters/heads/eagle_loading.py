"""Loading an EAGLE head from a folder: specdec's own (head file and config, refused on any other target than the one
it was trained for) or, from a folder without specdec's files, a head the EAGLE authors publish for EAGLE-1 and
EAGLE-2 (eagle_published.py)."""

from __future__ import annotations

import json
from pathlib import Path

from ...errors import IncompatibleDraftError
from ...files import read_tensors
from .eagle_head import CONFIG_FILE, HEAD_FILE, EagleConfig, EagleHead, frozen_parts, target_fingerprint
from .eagle_published import load_published


def load_head(folder: str | Path, target) -> EagleHead:
    """Loads a head onto its target (a LoadedModel): specdec's own (refused on any other target) or, from a folder
    without specdec's files, an EAGLE-1/2 head in its authors' layout (checked against the target's sizes)."""
    folder = Path(folder)
    if not (folder / HEAD_FILE).is_file() or not (folder / CONFIG_FILE).is_file():
        return load_published(folder, target)
    data = json.loads((folder / CONFIG_FILE).read_text())
    data.pop("training", None)
    config = EagleConfig(**data)
    hf_model = target.hf_model
    mine = target_fingerprint(hf_model.get_input_embeddings().weight)
    if mine != config.target_fingerprint:
        raise IncompatibleDraftError(
            f"the EAGLE head in {folder} was trained for target {config.target!r} "
            f"(fingerprint {config.target_fingerprint}), not for {target.name!r} ({mine})"
        )
    tensors = read_tensors(folder / HEAD_FILE, "the EAGLE head")
    draft_ids = tensors.pop("draft_ids")
    head = EagleHead(config, *frozen_parts(hf_model, draft_ids))
    head.load_state_dict({k: v.float() for k, v in tensors.items()})
    return head.eval()
