"""Text in, predictions out, from an export directory alone (no training code, no config).

``Predictor(export_dir, backend)`` loads and verifies the manifest, the exported
vocabulary and one engine (Paddle Inference or onnxruntime).  ``predict(texts)``
tokenises with the exported vocab, applies the manifest's long-text policy
(truncate: flagged in the result; window: windows aggregated with the shared
``ppvarlen.data.longtext`` rules; error: the text is refused), sorts rows by
length into token-budget batches (``ppvarlen.data.order``) and returns one
result per text in input order, shaped by the task's ``response`` (``ppvarlen.tasks``), whose
pydantic model the task declares (``prediction_model``; docs/TASKS.md shows each task's).  With
``split_long_sources`` (seq2seq) a source longer than the export's ``max_len`` is cut into
pieces after clause punctuation (``longtext.clause_spans``), each decoded on its own, and the
outputs joined in order; otherwise the manifest's policy applies.
"""
import functools
import os
import time

import numpy as np

from ppvarlen.config import ConfigError
from ppvarlen.data import longtext
from ppvarlen.data.collate import pad_sequences
from ppvarlen.data.errors import DataError
from ppvarlen.data.order import length_sorted_batches, restore_order
from ppvarlen.data.vocab import TextEncoder, char_spans  # noqa: F401 (also imported from here)
from ppvarlen.tasks import get_task
from ppvarlen.utils.inputs import is_blank, validate_batch

from ppvarlen.runtime import precision_choice
from ppvarlen.runtime.backends import build_engine, input_names
from ppvarlen.runtime.manifest import UnservableExportError, load_manifest, require_listed

# Re-runs at warm-up of the oneDNN grid shapes timed slower than a larger shape
# (``ShapeGrid.slowed``), at most: a burst of other work during a shape's run.
GRID_RETIME_ROUNDS = 2
# Passes over a grid of weight copies at warm-up: one sets each shape's kernels and copy up,
# two time it.  Such a grid serves decode loops, whose cost need not grow with the shape
# (rows end at different steps), so a slower smaller shape says nothing there.
COPY_GRID_PASSES = 3


class NonFiniteOutput(RuntimeError):
    """The model produced NaN or inf for a text: a broken model version, never an answer."""


def _finite(value):
    """True unless a float array in ``value`` (an array, or a tuple/list of them) holds NaN/inf."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind not in "fc" or bool(np.all(np.isfinite(value)))
    if isinstance(value, (tuple, list)):
        return all(_finite(v) for v in value if isinstance(v, (np.ndarray, tuple, list)))
    return True


def _joined(pieces):
    """``run_engine``'s (named outputs, seq_len) of a batch's row pieces -> the batch's:
    per-row outputs (as many rows as the piece) in row order, others the first piece's.  A
    piece's output can end at its own longest row (a Viterbi path): such rows are padded with
    zeros past their length, where every reader cuts them (``seq_len``)."""
    outs, lens = zip(*pieces)
    joined = {}
    for name, first in outs[0].items():
        values = [np.asarray(o[name]) for o in outs]
        if not all(v.ndim and len(v) == len(n) for v, n in zip(values, lens)):
            joined[name] = first
            continue
        shape = [max(sizes) for sizes in zip(*(v.shape[1:] for v in values))]
        joined[name] = np.concatenate([
            np.pad(v, [(0, 0)] + [(0, top - size) for top, size in zip(shape, v.shape[1:])])
            for v in values])
    return joined, np.concatenate(lens)


class EncodedText:
    """One text ready for the model.

    ``windows``: id lists (special tokens included; one unless windowed);
    ``offsets``: first content token of each window; ``spans``: (start, end) char
    offsets of every content token (tagging); ``num_tokens``: ids over all windows.
    """

    __slots__ = ("text", "windows", "offsets", "spans", "truncated", "num_tokens", "extras")

    def __init__(self, text, windows, offsets, spans, truncated, extras=None):
        self.text = text
        self.windows = windows
        self.offsets = offsets
        self.spans = spans
        self.truncated = truncated
        self.num_tokens = sum(len(w) for w in windows)
        # per window: {declared input name: row aligned with the window's ids} (a task's inputs
        # after ids and lengths, e.g. segment ids)
        self.extras = extras


class Predictor:
    """Predictions for texts from an export directory; see the module docstring."""

    encoded_text = EncodedText  # what a task's ``encode_request`` returns (tasks import no deploy)

    def __init__(self, export_dir, backend="paddle", device="cpu", precision="fp32", threads=1,
                 max_batch_tokens=8192, max_batch_size=64, tensorrt=False, verify=True,
                 split_long_sources=False, allow_external_symlinks=False,
                 onednn_cache_bytes=None, onednn_shape_grid=None, workload="files",
                 _shared=None):
        """``precision``, ``backend`` or ``threads`` "auto" is decided on this host by the rule
        the server and ``ppvarlen-infer`` follow (``precision_choice.load_admitted``), the
        candidates timed on the batches of ``workload``: "files" (lists of texts, as
        ``ppvarlen-infer`` runs them) or "requests" (a server's few texts at a time)."""
        if threads == "auto" and device != "cpu":
            threads = 1  # the device does the math (load_admitted logs the same)
        if _shared is None and (device == "cpu" and "auto" in (precision, threads)
                                or backend == "auto"):
            # decided on this host, by the rule the server and ppvarlen-infer use
            chosen = precision_choice.load_admitted(
                functools.partial(Predictor, backend=backend, device=device, threads=threads,
                                  max_batch_tokens=max_batch_tokens,
                                  max_batch_size=max_batch_size, tensorrt=tensorrt,
                                  verify=verify, split_long_sources=split_long_sources,
                                  allow_external_symlinks=allow_external_symlinks,
                                  onednn_cache_bytes=onednn_cache_bytes,
                                  onednn_shape_grid=onednn_shape_grid),
                export_dir, precision, device, workload=workload)
            _shared = chosen.__dict__
        if _shared is not None:
            self.__dict__.update(_shared)
        else:
            self.export_dir = export_dir
            self.backend = backend
            self.threads = int(threads)  # math threads (threads auto: chosen, threads_choice)
            self.manifest = m = load_manifest(export_dir, verify=verify,
                                              allow_external_symlinks=allow_external_symlinks)
            self.task = get_task(m["task"])  # its outputs, responses and limits
            self.label_names = list(m["label_names"])
            tok = m["tokenizer"] if isinstance(m["tokenizer"], dict) else {"kind": m["tokenizer"]}
            require_listed(export_dir, m, "vocab.txt")
            if os.path.exists(os.path.join(export_dir, "encoder.json")):
                require_listed(export_dir, m, "encoder.json")  # it sets kind and lowercase
            self.encoder = TextEncoder.load(export_dir, tok.get("kind"))
            special = tok.get("add_special_tokens")  # null = the task's default (Data schema)
            self.add_special_tokens = self.task.default_special_tokens if special is None \
                else special
            if self.task.pairs:
                # the seq2seq dataset encodes sources without specials whatever the setting
                self.add_special_tokens = False
            self.decoding = m.get("decoding")
            if split_long_sources and not self.task.generates:
                raise ConfigError(f"split_long_sources is for seq2seq exports; {export_dir} is a "
                                 f"{self.task.name} export (its long-text policy is in the "
                                 f"manifest)")
            self.split_long_sources = bool(split_long_sources)
            self.max_len = int(m["max_len"])
            self.max_position = m.get("max_position")
            policy = m["long_text"]
            self.long_text = policy if isinstance(policy, str) else policy["policy"]
            self.stride = int(m.get("stride", 0) if isinstance(policy, str)
                              else policy.get("stride", 0))
            # ONNX graphs cannot hold Paddle's viterbi op: tags are decoded here, in numpy,
            # from the exported emissions and the crf matrix [T+2, T].
            self.crf_matrix = None
            entry = m["backends"].get(backend) or {}
            if entry.get("decode") == "viterbi_numpy":
                rel = entry.get("crf_transitions", "onnx/crf_transitions.npy")
                self.crf_matrix = np.load(require_listed(export_dir, m, rel), allow_pickle=False)
            self.max_batch_tokens = int(max_batch_tokens)
            self.max_batch_size = int(max_batch_size)
            if self.max_batch_tokens < self.max_len:
                raise ConfigError(f"max_batch_tokens {self.max_batch_tokens} is below the export's "
                                 f"max_len {self.max_len}; one full-length text must fit a batch")
            if tensorrt:  # TensorRT engines refuse shapes outside the exported ranges
                top_batch, top_len = m["shape_ranges"][input_names(m)[0]]["max"]
                if self.max_len > top_len:
                    raise UnservableExportError(f"max_len {self.max_len} exceeds the TensorRT shape range "
                                                f"(max length {top_len}) in the manifest; re-export")
                self.max_batch_size = min(self.max_batch_size, int(top_batch))
            # an explicit precision (auto off CPU: fp32); warns on one measured slower
            self.precision = precision_choice.resolve(m, backend, precision, device)
            self.engine = build_engine(export_dir, m, backend, device=device,
                                       precision=self.precision, threads=threads,
                                       tensorrt=tensorrt, onednn_cache_bytes=onednn_cache_bytes,
                                       onednn_shape_grid=onednn_shape_grid,
                                       max_rows=self.max_batch_size)
        # Counted over the arrays really run: padding efficiency = real / padded.
        self.real_tokens = 0
        self.padded_tokens = 0
        # seq2seq: decoder steps a batch ran (rows x steps) vs output tokens incl. EOS
        self.real_target_tokens = 0
        self.padded_target_tokens = 0

    def clone(self, threads=None):
        """A predictor for another thread: shares manifest and vocab, owns its engine.  With
        ``threads`` other than its own: an engine of that many math threads (another session,
        another weight copy; ``can_change_threads``)."""
        counters = ("real_tokens", "padded_tokens", "real_target_tokens", "padded_target_tokens")
        shared = {k: v for k, v in self.__dict__.items() if k != "engine" and k not in counters}
        if threads is None or int(threads) == self.threads:
            shared["engine"] = self.engine.clone()
        else:
            shared["engine"] = self.engine.with_threads(int(threads))
            shared["threads"] = int(threads)
        return Predictor(None, _shared=shared)

    def can_change_threads(self):
        """Whether ``clone(threads=N)`` can build an engine of another thread count (ONNX
        Runtime's session for a single graph; not Paddle Inference, whose clones share their
        predictor's settings, nor the seq2seq decode loops)."""
        return callable(getattr(self.engine, "with_threads", None))

    def warmup(self, lengths=(8, 32, 128), kept_times=None):
        """Run a few batch shapes once so the first requests skip kernel set-up; not counted.
        An engine with a ``ShapeGrid`` runs every grid shape instead and times it; each shape
        keeps its fastest run (``run_engine``), which the batcher plans with.  With one weight
        copy for every shape, one pass (a shape's first run costs about a held one): a burst
        of other work during one run inflates that shape's time, and more work never costs
        less, so a shape timed slower than a larger one runs again (``ShapeGrid.slowed``, up to
        ``GRID_RETIME_ROUNDS``), and the largest shape, which no shape covers, twice.  With a
        copy per shape, ``COPY_GRID_PASSES``.
        ``kept_times`` ({(rows, width): seconds}, ``choice_cache.kept_grid_times``): a previous
        start's fastest times (re-timed there as above), which seed the grid; one pass then
        sets the kernels up, and lowers a time only when faster.  Clones share the grid.
        Paddle caches oneDNN kernels per thread: call this in the thread that will run the
        batches."""
        grid = getattr(self.engine, "shape_grid", None)
        if grid is not None:
            for (rows, width), seconds in (kept_times or {}).items():
                grid.observe(rows, width, seconds)
            shared = self.engine.settings.get("onednn_shared_weights")
            for _ in range(1 if kept_times or shared else COPY_GRID_PASSES):
                for rows, width in grid.shapes():
                    self.run_engine([[self.encoder.unk_id] * width] * rows)
            largest = {(grid.rows[-1], grid.widths[-1])}
            for _ in range(GRID_RETIME_ROUNDS if shared and not kept_times else 0):
                for rows, width in sorted(largest | set(grid.slowed())):
                    self.run_engine([[self.encoder.unk_id] * width] * rows)
                largest = set()
            self._reset_counters()
            return
        if self.task.generates:  # every run decodes many steps of growing shapes already
            lengths = lengths[:1]
        for n in lengths:
            n = min(n, self.max_len)
            for rows in (1, 4):
                self._run_rows([[self.encoder.unk_id] * n] * rows)
        self._reset_counters()

    def _reset_counters(self):
        self.real_tokens = self.padded_tokens = 0
        self.real_target_tokens = self.padded_target_tokens = 0

    def measure_overhead_tokens(self, repeats=7):
        """A forward pass's fixed cost, in tokens of work: fit time = c0 + c1 * tokens.

        Paddle Inference spends milliseconds per run before any math, onnxruntime a
        tenth of that, so how much padding is worth a separate batch depends on the
        backend.  Shapes are timed round-robin (so a burst of load elsewhere hits
        them all), the best time of each is kept, and a line is fitted through them.

        Seq2seq: a batch runs as many decoder steps as its longest output, and the
        cost of a step grows with the steps before it (attention over the cache),
        so lengths cannot be mixed in one fit: only the batch size varies, at the
        median source length n (time = c0 + c1 x rows; overhead = n x c0 / c1), and
        three rounds (a round decodes hundreds of steps).  The fixed cost really
        grows with the batch's length; one constant at the median length is the
        planner's approximation.  Paddle's in-graph loop costs milliseconds per step
        whatever the batch size, so a row can cost next to nothing: the bound is
        then a whole batch (``max_batch_tokens``), i.e. merge whatever fits.
        """
        runs, cap, noisy = repeats, 4 * self.max_len, self.max_len
        if self.task.generates:
            n = (self.manifest.get("length_profile") or {}).get("p50") or self.max_len
            shapes = [(rows, int(min(n, self.max_len))) for rows in (1, 2, 4, 8)]
            runs, cap = min(repeats, 3), self.max_batch_tokens
            noisy = cap  # extra rows cost nothing measurable: batch them
        else:
            shapes = [(rows, min(n, self.max_len))
                      for rows, n in ((1, 8), (1, 64), (4, 32), (8, 64))]
        best = [float("inf")] * len(shapes)
        for _ in range(runs):
            for k, (rows, n) in enumerate(shapes):
                ids = [[self.encoder.unk_id] * n] * rows
                start = time.perf_counter()
                self._run_rows(ids, fit=False)  # the fit is over the shapes' own positions
                best[k] = min(best[k], time.perf_counter() - start)
        self._reset_counters()
        tokens = np.array([rows * n for rows, n in shapes], dtype=np.float64)
        per_token, fixed = np.polyfit(tokens, np.array(best), 1)
        if per_token <= 0:  # timings too noisy to tell: one full-length text (seq2seq: cap)
            return noisy
        return int(np.clip(fixed / per_token, 0, cap))

    # ------------------------------------------------------------ text -> ids
    def encode(self, text, long_text=None):
        """``EncodedText`` for one text; DataError for a text this export cannot take.

        ``long_text``: a request's own policy (error | truncate | window) instead of the
        manifest's."""
        policy = long_text or self.long_text
        if not isinstance(text, str):
            raise DataError(f"text must be a string, got {type(text).__name__}")
        if is_blank(text):
            raise DataError("text is empty; send at least one non-space character")
        tokens = self.encoder.tokenize(text)
        if not tokens:
            raise DataError("text has no tokens after tokenisation (only spaces/control "
                            "characters?)")
        ids = self.encoder.encode(tokens)
        specials = 2 if self.add_special_tokens else 0
        max_content = self.max_len - specials
        if self.split_long_sources and len(ids) > max_content:
            spans = longtext.clause_spans(tokens, max_content)
            return EncodedText(text, [ids[s:e] for s, e in spans], [s for s, _ in spans], None, False)
        if policy == "error" and len(ids) > max_content:
            fix = self.task.too_long_fix()
            raise DataError(f"text has {len(ids)} tokens but this export takes at most "
                            f"{max_content} (max_len {self.max_len}) and the long_text policy is "
                            f"'error'; {fix}")
        windows, spans = longtext.text_windows(
            ids, self.max_len, policy, self.stride, "text",
            (self.encoder.cls_id, self.encoder.sep_id) if self.add_special_tokens else None)
        offsets = [start for start, _ in spans]
        truncated = policy == "truncate" and len(ids) > max_content
        spans = char_spans(text, tokens, self.encoder.lowercase) if self.task.token_spans else None
        return EncodedText(text, windows, offsets, spans, truncated)

    # ------------------------------------------------------------ ids -> results
    def predict(self, texts):
        """One result per text, in input order (raises DataError naming the bad text's index)."""
        items = []
        for i, t in enumerate(texts):
            try:
                items.append(self.task.encode_request(self, t, None))
            except DataError as e:
                raise DataError(f"text {i}: {e}") from None
        return self.predict_encoded(items)

    def predict_encoded(self, items):
        rows = [(i, w) for i, it in enumerate(items) for w in range(len(it.windows))]
        lengths = [len(items[i].windows[w]) for i, w in rows]
        if rows and len(rows) <= self.max_batch_size \
                and len(rows) * max(lengths) <= self.max_batch_tokens:
            # one batch (what the server's batcher hands over): the packer's answer, without
            # its numpy set-up, which costs a small batch more than its rows
            batches = [sorted(range(len(rows)), key=lengths.__getitem__)]
        else:
            batches = length_sorted_batches(lengths, self.max_batch_tokens, self.max_batch_size)
        per_batch = [self._run_rows([items[rows[r][0]].windows[rows[r][1]] for r in b],
                                    [items[rows[r][0]].extras[rows[r][1]] for r in b]
                                    if items[0].extras else None)
                     for b in batches]
        outputs = restore_order(batches, per_batch)  # one output per row, row order
        per_item = [[] for _ in items]
        for (i, _), out in zip(rows, outputs):
            per_item[i].append(out)
        bad = [i for i, outs in enumerate(per_item) if not all(map(_finite, outs))]
        if bad:  # never a NaN answer: the caller refuses these texts (the batcher isolates them)
            raise NonFiniteOutput(f"the model's outputs are not finite (NaN/inf) for "
                                  f"{len(bad)} of {len(items)} text(s), e.g. text {bad[0]}")
        return [self.task.response(self, it, outs) for it, outs in zip(items, per_item)]

    def _run_rows(self, id_lists, extras=None, fit=True):
        """Pad, validate, run; per row: logits [C], tag ids [len] or generated ids (seq2seq).
        ``extras``: per row {name: aligned row} of the task's further declared inputs, padded
        with their declared pad value.  ``fit`` False: at the batch's own shape even on a
        grid engine (``run_engine``); on one, a batch with more rows than the grid's most runs
        in pieces of that many rows."""
        grid = getattr(self.engine, "shape_grid", None) if fit else None
        if grid is not None and len(id_lists) > grid.rows[-1]:
            top = grid.rows[-1]
            return [row for i in range(0, len(id_lists), top)
                    for row in self._run_rows(id_lists[i:i + top], extras and extras[i:i + top])]
        out, seq_len = (self.run_engine if fit else self._run_exact)(id_lists, extras)
        rows = self.task.engine_rows(self, out, seq_len)
        steps = self.task.target_counts(rows)
        if steps is not None:
            self.real_target_tokens += steps[0]
            self.padded_target_tokens += steps[1]
        return rows

    def run_engine(self, id_lists, extras=None, width=None):
        """Pad (to the longest row, or to ``width``), validate and run id rows -> (the engine's
        named outputs, seq_len); counted.  An engine with a ``shape_grid`` (Paddle, oneDNN:
        a ``ShapeGrid``) runs every batch at its grid shape: more rows (copies of the first,
        their answers dropped) and a wider pad.  Every run goes through here (admission,
        timing, warm-up, traffic), so Paddle's cache holds no shape off the grid: one it held
        would stay and push grid shapes out (Paddle drops shapes in hash order), or, with one
        weight copy for every shape, stay for good.  A batch with more rows than the grid's
        most runs in pieces of that many rows, at one width (``_run_rows`` splits traffic
        first), except a decode loop's: each piece's outputs end at its own last step, so it
        runs whole at its own shape, counted in ``grid.off_grid`` as one wider than the
        grid."""
        grid = getattr(self.engine, "shape_grid", None)
        if grid is None:
            return self._run_exact(id_lists, extras, width)
        n = len(id_lists)
        width = max(max(len(x) for x in id_lists), int(width or 0))
        top = grid.rows[-1]
        if n > top and not self.task.generates:
            return _joined([self.run_engine(id_lists[i:i + top], extras and extras[i:i + top],
                                            width) for i in range(0, n, top)])
        rows, width = grid.fit(n, width)
        start = time.perf_counter()
        if rows == n:
            result = self._run_exact(id_lists, extras, width)
            grid.observe(rows, width, time.perf_counter() - start)
            return result
        copies = rows - n
        out, seq_len = self._run_exact(list(id_lists) + [id_lists[0]] * copies,
                                       extras and list(extras) + [extras[0]] * copies, width)
        grid.observe(rows, width, time.perf_counter() - start)
        self.real_tokens -= copies * len(id_lists[0])  # the copies are padding
        out = {name: value[:n] if getattr(value, "ndim", 1) and len(value) == rows else value
               for name, value in out.items()}
        return out, seq_len[:n]

    def _run_exact(self, id_lists, extras=None, width=None):
        """``run_engine`` at the batch's own shape (``width``: at least that wide)."""
        seq_len = np.array([len(x) for x in id_lists], dtype=np.int64)
        width = max(int(seq_len.max()), int(width or 0))
        input_ids = pad_sequences(id_lists, self.encoder.pad_id, width)
        validate_batch(input_ids, seq_len, max_position=self.max_position,
                       vocab_size=self.encoder.vocab_size)
        more = []
        if len(self.task.input_specs) > 2:
            pads = {f.name: f.pad for f in self.task.store_fields()}
            for spec in self.task.input_specs[2:]:
                name = spec["name"]
                rows = [e[name] for e in extras] if extras else [[0] * n for n in seq_len]
                pad = self.encoder.pad_id if pads.get(name, 0) == "pad_id" else pads.get(name, 0)
                more.append(pad_sequences(rows, pad, width))
        out = self.engine.run(input_ids, seq_len, *more)
        self.real_tokens += int(seq_len.sum())
        self.padded_tokens += int(input_ids.size)
        return out, seq_len
