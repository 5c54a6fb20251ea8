"""OpenAI-compatible HTTP server over the batched speculative engine (`specdec serve`).

Modules, one role each: `schemas` (request validation), `worker` (the engine's step loop in one
thread), `handle` (a request's asyncio end), `generation` and `routes` (the endpoints), `responses`
(OpenAI objects and chunks), `tools` (function calling), `errors` (OpenAI error bodies), `metrics` (Prometheus), `state`
(settings, admission, health), `app` (FastAPI), `launch` (uvicorn, graceful shutdown), `loading`
(the decoder), `process` (a server child process), `loadgen` and `bench_report` (`bench-serve`).
Nothing here is imported by `import specdec`; fastapi and uvicorn are the `serve` extra.
"""
