"""Drafters that run a language model: another model (draft_model), one with another tokenizer (cross_tokenizer),
the target's own 4-bit copy (quantized) and its first layers (layerskip)."""
