"""Benchmarks: specdec against transformers on the same prompts, in one process."""
