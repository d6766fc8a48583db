"""The server's Prometheus metrics (``GET /metrics``): requests running and waiting and KV pages in use, as the engine's
last step left them; time to first token, inter-token latency and end-to-end latency histograms; prompt and generated
tokens; finished requests by finish reason; the engine's step counters; this (front-end) process's CPU time; each
process's time in garbage collections. Times are the front end's: from a request's arrival at the server to each
token's arrival from the engine."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from models.server.heap import CollectorClock

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
                   20.0, 40.0, 80.0)  # fmt: skip
ITL_BUCKETS = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LAG_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05)
INTAKE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)  # a burst queues here


class ManyHistogram:
    """A Prometheus histogram fed many observations at once (``observe_many``: one numpy pass, not a locked
    increment an observation): what a request's inter-token gaps need at thousands of tokens a second."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...], registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = np.asarray(buckets, np.float64)
        self.counts = np.zeros(len(buckets) + 1, np.int64)  # [i]: observations in (bounds[i-1], bounds[i]]; last: +Inf
        self.sum = 0.0
        registry.register(self)

    def observe_many(self, x: np.ndarray) -> None:
        self.counts += np.bincount(np.searchsorted(self.bounds, x, side="left"), minlength=len(self.counts))
        self.sum += float(x.sum())

    def collect(self):
        cum = np.cumsum(self.counts).tolist()
        family = HistogramMetricFamily(self.name, self.documentation)
        family.add_metric([], [(repr(float(b)), c) for b, c in zip(self.bounds.tolist(), cum, strict=False)]
                          + [("+Inf", cum[-1])], self.sum)  # fmt: skip
        yield family


class Metrics:
    def __init__(self, load, collector: CollectorClock) -> None:
        """``load()``: the engine's last ``client.Load``; ``collector``: this process's garbage collections."""
        r = self.registry = CollectorRegistry()
        Gauge("resplan_requests_running", "Requests admitted by the engine", registry=r).set_function(
            lambda: load().running)
        Gauge("resplan_requests_waiting", "Requests waiting for admission", registry=r).set_function(
            lambda: load().waiting)
        Gauge("resplan_kv_pages_used", "KV pages held by requests", registry=r).set_function(lambda: load().pages_used)
        Gauge("resplan_kv_pages_total", "KV pages the pools hold", registry=r).set_function(lambda: load().pages_total)
        Gauge("resplan_engine_steps", "Steps the engine ran", registry=r).set_function(lambda: load().steps)
        Gauge("resplan_engine_decode_steps", "Decode steps the engine ran", registry=r).set_function(
            lambda: load().decode_steps)
        Gauge("resplan_engine_decode_step_seconds", "Wall time of the engine's decode steps, summed",
              registry=r).set_function(lambda: load().decode_ns * 1e-9)  # fmt: skip
        Gauge("resplan_engine_decode_steps_beside_pass", "Decode steps launched while a prefill pass ran beside them",
              registry=r).set_function(lambda: load().decode_beside_pass)  # fmt: skip
        Gauge("resplan_engine_prefill_passes", "Prefill passes the engine ran", registry=r).set_function(
            lambda: load().prefill_passes)
        Gauge("resplan_engine_prefill_tokens", "Prompt tokens the engine's prefill passes ran",
              registry=r).set_function(lambda: load().prefill_tokens)  # fmt: skip
        Gauge("resplan_engine_prefill_pass_seconds", "Wall time of the engine's prefill passes, summed (launch to "
              "land)", registry=r).set_function(lambda: load().prefill_ns * 1e-9)  # fmt: skip
        Gauge("resplan_prefix_cache_hits", "Requests that restored a prefix cache checkpoint",
              registry=r).set_function(lambda: load().prefix_hits)  # fmt: skip
        Gauge("resplan_prefix_cache_prompt_tokens", "Prompt tokens served from the prefix cache (not computed)",
              registry=r).set_function(lambda: load().prefix_cached_tokens)  # fmt: skip
        Gauge("resplan_engine_gc_seconds", "The engine process's time in garbage collections (each stalls a step)",
              registry=r).set_function(lambda: load().gc_seconds)  # fmt: skip
        Gauge("resplan_frontend_gc_seconds", "This process's time in garbage collections (each stalls every stream)",
              registry=r).set_function(lambda: collector.seconds)  # fmt: skip
        ProcessCollector(registry=r)  # process_cpu_seconds_total: the front end's CPU (the engine's is its own)
        self.ttft = Histogram("resplan_time_to_first_token_seconds", "Arrival to first token", registry=r,
                              buckets=LATENCY_BUCKETS)  # fmt: skip
        self.itl = ManyHistogram("resplan_inter_token_latency_seconds", "Gap between a request's consecutive tokens",
                                 ITL_BUCKETS, r)  # fmt: skip
        self.e2e = Histogram("resplan_e2e_request_latency_seconds", "Arrival to the last token", registry=r,
                             buckets=LATENCY_BUCKETS)  # fmt: skip
        self.step_lag = Histogram("resplan_frontend_step_lag_seconds", "From the engine process sending a step's "
                                  "tokens to the front end handing them to their streams", registry=r,
                                  buckets=LAG_BUCKETS)  # fmt: skip
        self.intake = Histogram("resplan_engine_intake_seconds", "From a request's arrival at the server to its "
                                "submission in the engine process (tokenized, sent, taken)", registry=r,
                                buckets=INTAKE_BUCKETS)  # fmt: skip
        self.steps_per_wakeup = Histogram("resplan_frontend_steps_per_wakeup", "Engine steps the front end's reader "
                                          "took in one wake-up (more than one: a stream may send two tokens in one "
                                          "chunk)", registry=r, buckets=(1, 2, 3, 4, 8))  # fmt: skip
        self.prompt_tokens = Counter("resplan_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("resplan_generation_tokens", "Tokens generated", registry=r)
        self.finished = Counter("resplan_requests_finished", "Requests finished", ["finish_reason"], registry=r)

    def request_done(self, arrived: float, token_times: list[float], prompt_tokens: int, reason: str) -> None:
        """A choice ended: its latencies (``token_times``: each token's arrival, perf_counter seconds) and counts."""
        if token_times:
            self.ttft.observe(token_times[0] - arrived)
            self.e2e.observe(token_times[-1] - arrived)
            if len(token_times) > 1:
                self.itl.observe_many(np.diff(np.asarray(token_times)))
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(len(token_times))
        self.finished.labels(reason).inc()

    def delivered(self, lags: list[float], intakes: list[float]) -> None:
        """One wake-up of the engine client's reader delivered steps with these lags (s, from the engine's send),
        carrying these requests' intakes (s, from their arrival here to their submission in the engine)."""
        for lag in lags:
            self.step_lag.observe(lag)
        for t in intakes:
            self.intake.observe(t)
        self.steps_per_wakeup.observe(len(lags))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


# with several front ends (--front-ends): gauges each front end has of its own, summed over them like the counters and
# histograms; every other gauge is the engine's, the same in each (its last step message), and is the first's
PER_FRONT_END_GAUGES = ("resplan_frontend_gc_seconds", "process_virtual_memory_bytes", "process_resident_memory_bytes",
                        "process_open_fds")  # fmt: skip


class _Families:
    """A collector that gives parsed metric families back as they are."""

    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self):
        yield from self.families


def merged(texts: list[str]) -> bytes:
    """Front ends' expositions as one: the first's, with each counter's, histogram's and own gauge's
    (``PER_FRONT_END_GAUGES``) samples summed over all; a sample (a label set) only the others have is added as it
    is. (The text format gives each counter's ``_created`` timestamps as a gauge family of their own: the first's.)"""
    families: dict[str, tuple] = {}  # name -> (family, {(sample name, labels): index in its samples}, summed)
    for text in texts:
        for fam in text_string_to_metric_families(text):
            if fam.name not in families:
                summed = fam.type in ("counter", "histogram", "summary") or fam.name in PER_FRONT_END_GAUGES
                index = {(x.name, tuple(sorted(x.labels.items()))): i for i, x in enumerate(fam.samples)}
                families[fam.name] = (fam, index, summed)
                continue
            first, index, summed = families[fam.name]
            for x in fam.samples:
                key = (x.name, tuple(sorted(x.labels.items())))
                i = index.get(key)
                if i is None:
                    index[key] = len(first.samples)
                    first.samples.append(x)
                elif summed:
                    first.samples[i] = first.samples[i]._replace(value=first.samples[i].value + x.value)
    registry = CollectorRegistry()
    registry.register(_Families([f for f, _, _ in families.values()]))
    return generate_latest(registry)
