"""The resident memory a GGUF file's load adds to a process, a first and a second time, split into the process's own
pages and the libraries' (specdec/benchmarks/resident.py, as bench-shape measures it), one process per file.

    python experiments/load_memory.py --out experiments/results/NAME.json FILE.gguf[:ConfigClass] ...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CONTEXT = 8192


def measure(path: str, config_class: str) -> dict:
    """Run in a process of its own: the load's code imported, then two loads of `path`, each read around."""
    from specdec.benchmarks.resident import import_load_code, load_footprint, resident_bytes
    from specdec.models.loading import load_model

    import_load_code(config_class)
    size = os.path.getsize(path)
    loads, kept = {}, []
    for name in ("first", "second"):
        before = resident_bytes()
        kept.append(load_model(path, device="cpu", max_context=CONTEXT))
        loads[name] = load_footprint(before, resident_bytes(), size, CONTEXT)
    return {"file": path, "file_bytes": size, "config_class": config_class, **loads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="FILE.gguf[:ConfigClass] (default LlamaConfig)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child's part: one file, JSON on stdout
    args = parser.parse_args()
    if args.one:
        path, _, config_class = args.one.partition(":")
        print(json.dumps(measure(path, config_class or "LlamaConfig")))
        return
    results = []
    for spec in args.files:
        child = subprocess.run(
            [sys.executable, __file__, "--one", spec, "--out", "-", spec], capture_output=True, text=True, check=True
        )
        result = json.loads(child.stdout.strip().splitlines()[-1])
        results.append(result)
        print(
            f"{os.path.basename(result['file'])}: own {result['first']['own_over_file_bytes']:.2f}x "
            f"(all {result['first']['over_file_bytes']:.2f}x) first, "
            f"{result['second']['own_over_file_bytes']:.2f}x second"
        )
    from specdec.benchmarks.runner import machine_info, stamp

    meta = {**stamp(), "machine": machine_info(), "max_context": CONTEXT}
    with open(args.out + ".tmp", "w") as out:
        json.dump({"meta": meta, "loads": results}, out, indent=1)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
