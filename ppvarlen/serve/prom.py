"""The server's counters, one set: Prometheus (``GET /metrics``) and the JSON summary
(``GET /metrics.json``) are two views of the same ``ServerMetrics`` object.

Built with ``prometheus_client`` on a registry of the app's own (two apps in one process,
e.g. tests or one per Ray Serve replica process, never share counts).  One server process
holds every batcher thread (``Deploy.workers`` are threads), so its counts are the
server's.  Names (all prefixed ``ppvarlen_``) are listed in docs/SERVING.md.
"""
import collections
import threading

import numpy as np
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               Histogram, ProcessCollector, generate_latest)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)
TEXT_OUTCOMES = ("served", "truncated", "split", "refused")


class ServerMetrics:
    """The server's metric families on a registry of its own, and the inference routes'
    request counts and a window of recent latencies (bounded memory) for ``/metrics.json``."""

    def __init__(self, window=10000):
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        self.requests = Counter("ppvarlen_requests", "HTTP requests answered, by route template "
                                "and status", ["route", "status"], registry=r)
        self.request_seconds = Histogram("ppvarlen_request_duration_seconds",
                                         "time from request to answer, by route template",
                                         ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_seconds = Histogram("ppvarlen_queue_wait_seconds", "time a text waited in "
                                       "the batcher's queue before its batch ran",
                                       ["model", "version"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("ppvarlen_batch_size", "texts per forward batch",
                                    ["model", "version"], buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("ppvarlen_batch_tokens", "real (unpadded) tokens per batch",
                                      ["model", "version"], buckets=TOKEN_BUCKETS, registry=r)
        self.real_tokens = Counter("ppvarlen_real_tokens", "tokens of the texts run",
                                   ["model", "version"], registry=r)
        self.padded_tokens = Counter("ppvarlen_padded_tokens", "tokens of the padded arrays run "
                                     "(real + padding)", ["model", "version"], registry=r)
        self.padding_efficiency = Gauge("ppvarlen_padding_efficiency", "real / padded tokens "
                                        "since the version loaded", ["model", "version"],
                                        registry=r)
        self.texts = Counter("ppvarlen_texts", "texts by outcome: served, truncated (cut to "
                             "max_len), split (seq2seq pieces), refused (422)", ["outcome"],
                             registry=r)
        self.queue_depth = Gauge("ppvarlen_queue_depth", "texts waiting in the batchers' queues",
                                 registry=r)
        self.model_loaded = Gauge("ppvarlen_model_version_loaded", "1 while a model version "
                                  "takes traffic, 0 once unloaded", ["model", "version"],
                                  registry=r)
        self.load_failures = Counter("ppvarlen_model_load_failures", "model versions refused at "
                                     "load, by reason (manifest: files or hashes, load: the "
                                     "runtime, symlink, or the admission check that failed: "
                                     "graph, smoke, padding, render)",
                                     ["model", "version", "reason"], registry=r)
        self.model_healthy = Gauge("ppvarlen_model_version_healthy", "0 once a version "
                                   "produced non-finite outputs (its texts get 503), else 1",
                                   ["model", "version"], registry=r)
        self.nonfinite_outputs = Counter("ppvarlen_nonfinite_outputs", "texts refused because "
                                         "the model answered NaN/inf for them",
                                         ["model", "version"], registry=r)
        self.model_precision = Gauge("ppvarlen_model_precision", "1 for the backend and "
                                     "precision a model version serves (requested: "
                                     "Deploy.precision, auto = timed on this host at load), 0 "
                                     "once unloaded",
                                     ["model", "version", "backend", "precision", "requested"],
                                     registry=r)
        self.answers = Counter("ppvarlen_task_answers", "the task's answer counters, e.g. "
                               "tag_chunks_repaired (invalid tag sequences read by conlleval's "
                               "rule, docs/TAGGING.md)", ["counter"], registry=r)
        # present (at 0) before the first request; children kept, as the request path
        # counts into them on every answer (a labels() lookup takes a lock and a tuple)
        self._texts = {outcome: self.texts.labels(outcome) for outcome in TEXT_OUTCOMES}
        self._route_children = {}  # (route, status) -> (requests child, duration child)
        self._totals = {}
        self._lock = threading.Lock()  # batcher threads report concurrently
        self.inference_requests = 0
        self.responses = collections.Counter()  # the inference routes' answers by status
        self.text_counts = collections.Counter()  # served, truncated, split
        self.answer_counts = collections.Counter()
        self._latencies = collections.deque(maxlen=window)

    def mark_loaded(self, model):
        """A version (``ServedModel``) takes traffic: loaded, healthy, and in which precision."""
        self.model_loaded.labels(model.name, model.version).set(1)
        self.model_healthy.labels(model.name, model.version).set(1)
        self.model_precision.labels(*self._precision_labels(model)).set(1)

    def mark_unloaded(self, model):
        self.model_loaded.labels(model.name, model.version).set(0)
        self.model_precision.labels(*self._precision_labels(model)).set(0)

    @staticmethod
    def _precision_labels(model):
        choice = model.precision_choice
        return model.name, model.version, model.backend, choice["precision"], choice["requested"]

    def count_request(self):
        """An inference request arrived (``/predict``, OIP infer over REST or gRPC)."""
        with self._lock:
            self.inference_requests += 1

    def record(self, status, latency_s=None, texts=0, truncated=0, split=0, answers=None):
        """An inference request's answer (errors with only their status)."""
        with self._lock:
            self.responses[str(status)] += 1
            if latency_s is not None:
                self._latencies.append(latency_s * 1000.0)
            if texts:
                counts = self.text_counts
                counts["served"] += texts
                counts["truncated"] += truncated
                counts["split"] += split
            if answers:
                self.answer_counts.update(answers)
        if texts:
            self._texts["served"].inc(texts)
            if truncated:
                self._texts["truncated"].inc(truncated)
            if split:
                self._texts["split"].inc(split)
        for counter, n in (answers or {}).items():
            self.answers.labels(counter).inc(n)

    def refused(self, texts):
        self._texts["refused"].inc(texts)

    def snapshot(self):
        """The JSON summary's counters and latency percentiles."""
        with self._lock:
            lat = np.array(self._latencies, dtype=np.float64)
            out = {"requests": self.inference_requests, "responses": dict(self.responses),
                   "texts": self.text_counts["served"],
                   "truncated_texts": self.text_counts["truncated"],
                   "split_texts": self.text_counts["split"],
                   "answers": dict(self.answer_counts)}
        pct = {f"p{q}": float(np.percentile(lat, q)) if lat.size else None for q in (50, 95, 99)}
        out["latency_ms"] = {**pct, "mean": float(lat.mean()) if lat.size else None,
                             "window": int(lat.size)}
        return out

    def observe_request(self, route, status, seconds):
        children = self._route_children.get((route, status))
        if children is None:  # routes are templates and statuses few: a bounded set
            children = (self.requests.labels(route, str(status)),
                        self.request_seconds.labels(route))
            self._route_children[(route, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def observe_batch(self, model, version, size, real, padded, waits):
        """One batch a worker ran: its size, tokens and each text's queue wait."""
        labels = (model, version)
        self.batch_size.labels(*labels).observe(size)
        self.batch_tokens.labels(*labels).observe(real)
        self.real_tokens.labels(*labels).inc(real)
        self.padded_tokens.labels(*labels).inc(padded)
        q = self.queue_seconds.labels(*labels)
        for w in waits:
            q.observe(w)
        with self._lock:
            total = self._totals.setdefault(labels, [0, 0])
            total[0] += real
            total[1] += padded
            if total[1]:
                self.padding_efficiency.labels(*labels).set(total[0] / total[1])

    def exposition(self):
        """(body, content type) of the text format."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
