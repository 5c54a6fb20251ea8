"""Prompts the target writes or answers beyond the training files: Self-Instruct-style prompts it writes itself
(synthesize_prompts) and tasks over the texts it wrote (document_prompts). Their answers are extracted as any
other prompt-only record (extract.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ..errors import ConfigError
from ..files import read_lines


def cycle_sources(path: str | Path, count: int) -> list[str]:
    """`count` prompts taken round-robin across the file's `source` values, each source repeating once it runs
    out, so that every source opens the same share of synthetic prompts however small it is."""
    by_source: dict[str, list[str]] = {}
    for prompt, source in _prompt_rows(path):
        by_source.setdefault(source, []).append(prompt)
    groups = list(by_source.values())
    return [groups[i % len(groups)][(i // len(groups)) % len(groups[i % len(groups)])] for i in range(count)]


def _prompt_rows(path: str | Path) -> list[tuple[str, str]]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"training prompt file not found: {path}")
    rows = [json.loads(l) for l in read_lines(path) if l.strip()]
    return [
        (r["prompt"], r.get("source", "")) for r in rows if isinstance(r.get("prompt"), str) and r["prompt"].strip()
    ]


@torch.inference_mode()
def synthesize_prompts(
    target,
    openings: list[str],
    folder: Path,
    temperature: float = 0.9,
    max_tokens: int = 96,
    batch_size: int = 32,
    progress: bool = True,
) -> list[str]:
    """Self-Instruct-style prompts written by the target itself: its chat template's user turn opens with the
    first 2-5 words of a training prompt (`openings`, one prompt each) and the target, sampling at
    `temperature`, writes the rest of the turn. Turns that do not end within `max_tokens` are dropped, as are
    repeats. Cached in folder/synthetic_prompts.jsonl, which later runs reuse and extend."""
    from tqdm.auto import tqdm

    from .teacher import decode_batch

    tokenizer, backend = target.tokenizer, target.backend
    before, _ = _around_user_turn(tokenizer, "--synthesize", generation_prompt=False)
    folder.mkdir(parents=True, exist_ok=True)
    cache = folder / "synthetic_prompts.jsonl"
    done = [json.loads(l) for l in read_lines(cache) if l.strip()] if cache.exists() else []
    heads = [" ".join(o.split()[: 2 + i % 4]) for i, o in enumerate(openings)]  # 2-5 opening words
    if any(row["opening"] != h for row, h in zip(done, heads)):
        raise ConfigError(f"{cache} was written from other training prompts; use another --data-dir")
    eos = target.info.eos_token_ids
    bar = tqdm(
        total=len(openings),
        initial=len(done),
        desc="synthetic prompts",
        unit="prompt",
        disable=not progress,
        file=sys.stderr,
    )
    for first in range(len(done), len(openings), batch_size):
        chunk = heads[first : first + batch_size]
        ids = [tokenizer(before + h, add_special_tokens=False)["input_ids"] for h in chunk]
        answers = decode_batch(
            backend, ids, max_tokens, eos, temperature, seeds=range(first, first + len(ids)), keep_features=False
        )
        rows = []
        for opening, prefix, (tokens, *_) in zip(chunk, ids, answers):
            ended = tokens[-1] in eos
            text = opening + tokenizer.decode(tokens[len(prefix) : -1 if ended else None], skip_special_tokens=True)
            rows.append({"opening": opening, "prompt": text.strip(), "ended": ended})
        with cache.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        done += rows
        bar.update(len(rows))
    bar.close()
    seen, out = set(), []
    for row in done[: len(openings)]:
        if row["ended"] and len(row["prompt"]) > len(row["opening"]) + 8 and row["prompt"] not in seen:
            seen.add(row["prompt"])
            out.append(row["prompt"])
    return out


DOCUMENT_TASKS = (
    "Summarize the following text in a few sentences.\n\n{doc}",
    "Read the passage and answer the question.\n\nPassage:\n{doc}\n\nQuestion: What is the main point of the passage?",
    "List the key facts, names and numbers in this text.\n\n{doc}",
    "Write a one-paragraph summary of this article:\n{doc}",
    "Based only on the passage below, what does it conclude or recommend?\n\n{doc}",
    "Rewrite the following text in simpler words.\n\n{doc}",
    "Extract the main points of the text below as a bulleted list.\n\n{doc}",
    "Give the text below a title, then summarize it in two sentences.\n\n{doc}",
)


def document_prompts(sequences: list[dict], tokenizer, count: int, min_tokens: int = 64) -> list[str]:
    """`count` prompts asking about texts the target wrote itself: its answers in self-distilled `sequences`
    (at least `min_tokens` long) wrapped in summary, question, extraction and rewriting tasks (DOCUMENT_TASKS,
    in turn). They give the head the long-context work (RAG, summaries) the prompt file lacks; a text serves
    again, under the next task, once every text has served."""
    _, answer_start = _around_user_turn(tokenizer, "--document-tasks", generation_prompt=True)  # opens the reply
    documents, seen = [], set()
    for seq in sequences:
        text = tokenizer.decode(seq["tokens"].tolist(), skip_special_tokens=False)
        at = text.rfind(answer_start)
        if at < 0:
            continue
        answer = tokenizer.decode(
            tokenizer(text[at + len(answer_start) :], add_special_tokens=False)["input_ids"], skip_special_tokens=True
        ).strip()
        if len(tokenizer(answer, add_special_tokens=False)["input_ids"]) >= min_tokens and answer not in seen:
            seen.add(answer)
            documents.append(answer)
    if not documents:
        raise ConfigError(f"no answer of {min_tokens} tokens or more in the data to build document tasks from")
    n = len(documents)
    return [DOCUMENT_TASKS[(i + i // n) % len(DOCUMENT_TASKS)].format(doc=documents[i % n]) for i in range(count)]


def _around_user_turn(tokenizer, option: str, generation_prompt: bool) -> tuple[str, str]:
    """The chat template's text before and after a user turn's content (after: up to the assistant's turn
    opening when generation_prompt); `option` names what needs a template, for the error."""
    if not tokenizer.chat_template:
        raise ConfigError(f"{option} needs a model with a chat template")
    marker = "\x00SPECDEC\x00"
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": marker}], add_generation_prompt=generation_prompt, tokenize=False
    )
    at = rendered.index(marker)
    return rendered[:at], rendered[at + len(marker) :]
