"""Per model version counts and durations for Triton's statistics extension
(``GET /v2/models[/NAME[/versions/V]]/stats``, gRPC ``ModelStatistics``).

From the batcher's own timings and the request path, in the extension's terms:
``success`` / ``fail``: inference requests and the time from arrival to answer;
``queue``: each text's wait in the batcher's queue; ``compute_input``: a request's tokenising
(encoding) time; ``compute_infer``: each text's batch's forward pass (a text is counted with
the whole time of the batch it ran in, as Triton counts a batched request); ``compute_output``:
rendering the answer.  The queue and compute durations are counted per text, all at once
when the request is answered (perf_analyzer requires equal counts): a request's encoding and
rendering time is shared out over its texts.  ``inference_count``: texts; ``execution_count``: batches;
``batch_stats``: per batch size, batches and their forward time.
"""
import threading
import time

DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


class VersionStats:
    """Thread-safe counters of one model version (batcher threads and requests add to them)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._durations = {k: [0, 0] for k in DURATIONS}  # name -> [count, nanoseconds]
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self._batches = {}  # batch size -> [batches, compute nanoseconds]

    def _add(self, name, seconds, count=1):
        entry = self._durations[name]
        entry[0] += count
        entry[1] += int(seconds * 1e9)

    def observe_batch(self, size, compute_s):
        with self._lock:
            self.inference_count += size
            self.execution_count += 1
            self.last_inference_ms = int(time.time() * 1000)
            batch = self._batches.setdefault(size, [0, 0])
            batch[0] += 1
            batch[1] += int(compute_s * 1e9)

    def observe_success(self, seconds, input_s, timings, output_s):
        """One answered request, all its durations at once (so the counts always agree):
        ``timings`` (queue wait, forward pass) per text; encoding and rendering times are
        shared out over its texts."""
        n = len(timings)
        with self._lock:
            self._add("success", seconds)
            self._add("compute_input", input_s, n)
            self._add("compute_output", output_s, n)
            for queue_s, compute_s in timings:
                self._add("queue", queue_s)
                self._add("compute_infer", compute_s)

    def observe_failure(self, seconds):
        with self._lock:
            self._add("fail", seconds)

    def document(self, name, version):
        """The extension's ``model_stats`` entry (JSON field names; gRPC parses the same)."""
        with self._lock:
            durations = {k: {"count": c, "ns": ns} for k, (c, ns) in self._durations.items()}
            batches = sorted(self._batches.items())
            out = {"name": name, "version": version, "last_inference": self.last_inference_ms,
                   "inference_count": self.inference_count,
                   "execution_count": self.execution_count}
        out["inference_stats"] = {**durations, "cache_hit": {"count": 0, "ns": 0},
                                  "cache_miss": {"count": 0, "ns": 0}}
        out["batch_stats"] = [{"batch_size": size,
                               "compute_input": {"count": n, "ns": 0},
                               "compute_infer": {"count": n, "ns": ns},
                               "compute_output": {"count": n, "ns": 0}}
                              for size, (n, ns) in batches]
        return out
