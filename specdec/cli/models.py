"""`specdec models`: known aliases and what is cached."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("models", help="list built-in and cached models")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--fetch", metavar="ALIAS", help="fetch a built-in model's GGUF file now, and convert it to float32 safetensors"
    )
    p.set_defaults(run=run)


def run(args) -> int:
    from ..models.registry import KNOWN_MODELS, cache_root, list_models

    if args.fetch:
        from ..errors import ModelLoadError
        from ..models.fetch import ensure_gguf, ensure_known_model

        if args.fetch not in KNOWN_MODELS:
            raise ModelLoadError(f"unknown built-in model {args.fetch!r}; known: {', '.join(KNOWN_MODELS)}")
        print(ensure_gguf(args.fetch))
        print(ensure_known_model(args.fetch))
        return 0
    rows = list_models()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"cache: {cache_root()}  (set SPECDEC_CACHE to move it)")
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        held = f"cached ({', '.join(r['forms'])})" if r["cached"] else "not cached"
        print(f"{r['name']:<{width}}  {held:<21}  {r['description']}")
    return 0
