"""The server a `specdec bench-serve` run talks to: one already running (--url), or `specdec serve` started here
with bench-serve's model and server options."""

from __future__ import annotations

from .server_process import ServerProcess


def server_args(args, max_batch: int) -> list[str]:
    """The `specdec serve` options of a server started for `max_batch` requests, from bench-serve's."""
    out = [
        "--drafter",
        args.drafter,
        "-k",
        str(args.num_speculative_tokens),
        "--dtype",
        args.dtype,
        "--device",
        args.device,
        "--backend",
        args.backend,
        "--graphs",
        args.graphs,
        "--compile",
        args.compile,
        "--max-batch",
        str(max_batch),
        "--prefix-cache",
        str(args.prefix_cache),
        "--prefill-chunk",
        str(args.prefill_chunk),
        "--log-level",
        "warning",
    ]
    for flag, value in (
        ("--model", args.model),
        ("--draft-model", args.draft_model),
        ("--threads", args.threads),
        ("--max-context", args.max_context),
        ("--max-queue", args.max_queue),
    ):
        if value is not None:
            out += [flag, str(value)]
    return out + (["--dequantize"] if args.dequantize else [])


class BenchServer:
    """The server a run talks to: the one at --url, or `specdec serve` started here for `max_batch` requests (stop()
    ends it and keeps its exit status); model and health are read from it at once."""

    def __init__(self, args, max_batch: int):
        import httpx

        self.process = None if args.url else ServerProcess(server_args(args, max_batch)).start()
        self.url: str = args.url.rstrip("/") if self.process is None else self.process.url
        self.where = self.url if args.url else "started here"
        self.exit_status: int | None = None
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        try:
            self.model = httpx.get(f"{self.url}/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]
            self.health = httpx.get(f"{self.url}/health", timeout=30).json()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process is not None:
            self.exit_status = self.process.stop()
