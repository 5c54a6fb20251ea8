"""Prometheus metrics of a server; generation figures are read from GenerationMetrics, never recomputed.

The worker thread reports each ended sequence (observe_generation) and the load after each step;
the request handlers report HTTP outcomes, time to first token and latency as the client sees them
(queueing included). prometheus_client's metrics are thread-safe.
"""

from __future__ import annotations

import threading

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily

from ..metrics import GenerationMetrics
from .profile import thread_cpu_seconds

MAX_POSITIONS = 16  # per-position series for draft positions 0..15; later positions count under the last one
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class ServerMetrics:
    """One registry per server (tests may run several in one process)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        disable_created_metrics()  # no *_created series (process-wide)
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)  # process_resident_memory_bytes, CPU seconds, open files (Linux)
        self.requests = Counter(
            "specdec_requests",
            "HTTP requests by endpoint and status code (499: client gone)",
            ["endpoint", "status"],
            registry=r,
        )
        self.finished = Counter(
            "specdec_finished_sequences",
            "Ended sequences by finish reason (stop, length, cancelled)",
            ["reason"],
            registry=r,
        )
        self.prompt_tokens = Counter("specdec_prompt_tokens", "Prompt tokens of ended sequences", registry=r)
        self.cached_prompt_tokens = Counter(
            "specdec_prefix_cache_hit_tokens", "Prompt tokens whose prefill the prefix cache saved", registry=r
        )
        self.generation_tokens = Counter("specdec_generation_tokens", "Tokens generated", registry=r)
        self.drafted = Counter("specdec_draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted = Counter("specdec_accepted_tokens", "Draft tokens accepted", registry=r)
        self.steps = Counter("specdec_verify_steps", "Target verify steps (one per sequence per step)", registry=r)
        self.drafting_steps = Counter(
            "specdec_drafting_steps", "Verify steps that scored at least one draft token", registry=r
        )
        self.drafted_at = Counter(
            "specdec_draft_tokens_per_position",
            "Draft tokens proposed at each draft position "
            f"(0: the first; {MAX_POSITIONS - 1} holds the later ones too)",
            ["position"],
            registry=r,
        )
        self.accepted_at = Counter(
            "specdec_accepted_tokens_per_position",
            "Draft tokens accepted at each draft position (acceptance at position i: accepted / drafted there)",
            ["position"],
            registry=r,
        )
        self.by_acceptance = Counter(
            "specdec_generation_tokens_by_acceptance",
            "Tokens generated, by the acceptance "
            'rule that made them: acceptance="exact" (lossless) or a lossy rule '
            '(lossy="true", the text may differ from the model\'s own)',
            ["acceptance", "lossy"],
            registry=r,
        )
        self.acceptance = Gauge("specdec_acceptance_rate", "Accepted / drafted tokens since start", registry=r)
        self.mat = Gauge(
            "specdec_mean_accepted_tokens", "Tokens per verify step since start (MAT, bonus included)", registry=r
        )
        self.acceptance_length = Gauge(
            "specdec_mean_acceptance_length",
            "1 + accepted draft tokens per drafting step since start (vLLM's mean acceptance length)",
            registry=r,
        )
        self.ttft = Histogram(
            "specdec_time_to_first_token_seconds",
            "Request arrival to first generated token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "specdec_request_latency_seconds",
            "Request arrival to last byte (successful generations)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("specdec_queue_depth", "Requests waiting for a batch slot", registry=r)
        self.batch_size = Gauge("specdec_running_batch_size", "Sequences holding a batch slot (KV cache)", registry=r)
        self.step_batch = Histogram(
            "specdec_step_batch_size", "Sequences per engine step (one target pass)", buckets=BATCH_BUCKETS, registry=r
        )
        self.thread_cpu = Gauge(
            "specdec_thread_cpu_seconds",
            "CPU seconds used by the engine thread and by the HTTP "
            "layer's event loop thread, read from their own clocks at each scrape",
            ["thread"],
            registry=r,
        )
        self._totals = GenerationMetrics()
        self._lock = threading.Lock()

    def observe_generation(self, m: GenerationMetrics) -> None:
        """One ended sequence (finished or cancelled)."""
        self.finished.labels(m.finish_reason or "unknown").inc()
        self.prompt_tokens.inc(m.prompt_tokens)
        self.cached_prompt_tokens.inc(m.cached_prompt_tokens)
        self.generation_tokens.inc(m.new_tokens)
        self.by_acceptance.labels(m.acceptance, str(m.lossy).lower()).inc(m.new_tokens)
        self.drafted.inc(m.drafted_tokens)
        self.accepted.inc(m.accepted_tokens)
        self.steps.inc(m.steps)
        self.drafting_steps.inc(m.drafting_steps)
        for i, (drafted, accepted) in enumerate(zip(m.drafted_per_position, m.accepted_per_position)):
            position = str(min(i, MAX_POSITIONS - 1))
            self.drafted_at.labels(position).inc(drafted)
            self.accepted_at.labels(position).inc(accepted)
        with self._lock:
            self._totals = self._totals.merge(m)
            rate, mat = self._totals.acceptance_rate, self._totals.mean_accepted_tokens
            length = self._totals.mean_acceptance_length
        self.acceptance.set(rate or 0.0)
        self.mat.set(mat or 0.0)
        self.acceptance_length.set(length or 0.0)

    def observe_request(
        self, endpoint: str, status: int, latency_s: float | None = None, ttft_s: float | None = None
    ) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        if latency_s is not None:
            self.latency.observe(latency_s)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)

    def set_load(self, queued: int, running: int) -> None:
        self.queue_depth.set(queued)
        self.batch_size.set(running)

    def watch_engine(self, totals) -> None:
        """Reports totals() (seconds of the engine thread by part: server/profile.py) at each scrape."""
        self.registry.register(_EngineSeconds(totals))

    def exposition(self, threads: dict[str, int | None] | None = None) -> bytes:
        """The metrics in Prometheus' text format; threads: {name: thread id} whose CPU seconds to read now."""
        for name, ident in (threads or {}).items():
            seconds = thread_cpu_seconds(ident)
            if seconds is not None:
                self.thread_cpu.labels(name).set(seconds)
        return generate_latest(self.registry)


class _EngineSeconds:
    """specdec_engine_seconds_total{part}, read from the engine thread's clock when /metrics is scraped."""

    def __init__(self, totals):
        self.totals = totals

    def collect(self):
        family = CounterMetricFamily(
            "specdec_engine_seconds",
            "Wall seconds of the engine thread by part (idle, "
            "admission, prefill, draft, pass, verify, text, events: server/profile.py)",
            labels=["part"],
        )
        for part, seconds in self.totals().items():
            family.add_metric([part], seconds)
        yield family
