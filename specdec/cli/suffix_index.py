"""`specdec suffix-index build`: fill a suffix drafter's index file from the user's texts (code, documents, logs)."""

from __future__ import annotations

from ..errors import ConfigError

PIECE_TOKENS = 4096  # a document is stored in runs of at most this many tokens, as an output would be


def register(sub) -> None:
    p = sub.add_parser(
        "suffix-index", help="fill the suffix drafter's index file (--suffix-index FILE) from your own texts"
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    b = actions.add_parser(
        "build",
        help="tokenize text files, folders and .jsonl files with the model's tokenizer "
        "and write them to an index file that --suffix-index reads",
    )
    b.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="a text file, a folder (walked; binary and non-UTF-8 files are skipped) or a .jsonl file "
        "(each record's 'text', else 'completion', else its assistant 'messages')",
    )
    b.add_argument("--model", default=None, help="the target model whose tokenizer is used (default: smollm2-135m)")
    b.add_argument("--out", required=True, help="the index file (safetensors) to write")
    b.add_argument(
        "--append", action="store_true", help="keep what --out already holds and add to it (default: replace it)"
    )
    b.add_argument("--trust-remote-code", action="store_true", help="allow tokenizer code from the model's repo")
    b.set_defaults(run=run)


def run(args) -> int:
    from ..corpus import check_inputs, pieces, read_corpus
    from ..drafters.lookup.suffix import SuffixIndex, tokenizer_id
    from ..models.loading import load_tokenizer
    from ..models.registry import DEFAULT_MODEL

    check_inputs(args.inputs)
    model = args.model or DEFAULT_MODEL
    tokenizer, vocab_size = load_tokenizer(model, trust_remote_code=args.trust_remote_code)
    index = SuffixIndex.load(args.out, vocab_size, tokenizer=tokenizer_id(tokenizer), model=model, keep=args.append)
    before = index.tokens
    corpus = read_corpus(args.inputs)
    runs, documents = [], 0
    for text in corpus.documents:
        ids = tokenizer.encode(text, add_special_tokens=False)
        documents += len(ids) >= 2
        runs += [piece for piece in pieces(ids, PIECE_TOKENS) if len(piece) >= 2]
    if not runs:
        raise ConfigError(
            f"no text to index in {', '.join(args.inputs)} ({_count(corpus.files, 'file')} read, "
            f"{corpus.skipped_files} skipped as binary or not UTF-8)"
        )
    added = sum(len(r) for r in runs)
    index.store_all(runs)
    index.save()
    forgotten = before + added - index.tokens
    records = f"; {_count(corpus.skipped_records, 'JSONL record')} without text" if corpus.skipped_records else ""
    print(
        f"{_count(corpus.files, 'file')} read ({corpus.skipped_files} skipped as binary or not UTF-8{records}): "
        f"{_count(documents, 'document')}, {added} tokens added; {args.out} holds {index.tokens} tokens in "
        f"{_count(len(index.sequences), 'sequence')} (cap {index.max_tokens}"
        + (f"; its oldest {forgotten} tokens forgotten)" if forgotten else ")")
    )
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
