"""OpenAI-compatible HTTP server over the batched speculative engine (`specdec serve`).

Modules, one role each: `errors` (OpenAI error bodies), `schemas` (request validation), `worker`
(the engine's step loop in one thread), `handle` (a request's asyncio end), `responses` (OpenAI
response and chunk objects), `metrics` (Prometheus), `routes` and `app` (FastAPI), `launch`
(uvicorn and graceful shutdown), `loadgen` and `bench_report` (`specdec bench-serve`).
Nothing here is imported by `import specdec`; fastapi and uvicorn are the `serve` extra.
"""
