"""The measuring tools behind `specdec bench`, `bench-shape` and `bench-serve`, kept out of the runtime packages:
specdec against transformers and llama.cpp on the same prompts or files (runner, llamacpp, shapes), the serving
load generator, soak and fuzz (loadgen, soak, fuzz) and their reports, and a `specdec serve` child process to run
them against (server_process)."""
