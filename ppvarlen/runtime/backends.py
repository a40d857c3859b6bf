"""Run the exported graph: the manifest's declared inputs in, named arrays out.

``PaddleEngine`` (Paddle Inference) and ``OnnxEngine`` (onnxruntime) share one
interface: ``run(*inputs) -> {output_name: np.ndarray}`` (inputs in the manifest's order, the
task's ``input_specs``: ``input_ids`` [B, L], ``seq_len`` [B], ...) and ``clone()``
(an engine for another worker thread; Paddle predictors are not thread-safe).
Both are built from the export directory's manifest alone.  Seq2seq exports feed
``src_ids``/``src_len`` the same way: the Paddle program holds the whole greedy loop
(output ``tokens``); the ONNX export holds an encoder and one decoder step, so
``OnnxGreedyEngine`` runs the loop in numpy (``ppvarlen.utils.search``) and returns
``{"output_ids": [ids, ...]}``.

``build_engine`` is the one engine factory: the predictor (serve, infer, Ray) and the export's
parity check (``ppvarlen.export.parity``, on the export directory being written) both build
through it, so the settings checked at export are the settings served.  Every engine records
them in ``settings`` (parity.json keeps the checked ones; tests compare the two).
"""
import os
import tempfile
import threading

import numpy as np

from ppvarlen.runtime import gpu
from ppvarlen.config import ConfigError
from ppvarlen.config_schema import SCHEMA

from ppvarlen.runtime.manifest import UnservableExportError, require_listed
from ppvarlen.tasks import get_task
from ppvarlen.utils.search import greedy_search, length_limits

STEP_INPUTS = ("tokens", "src_len", "self_k", "self_v", "cross_k", "cross_v")
ONEDNN_CACHE_CAPACITY = 64  # most input shapes whose oneDNN kernels stay cached
# Memory the oneDNN shape cache may hold (Deploy.onednn_cache_bytes when not given): every
# cached input shape keeps its own reordered copy of the weight matrices, so the capacity is
# this budget over the size of one copy.
ONEDNN_CACHE_BUDGET_BYTES = SCHEMA["Deploy"]["onednn_cache_bytes"].default
# Whether Paddle oneDNN batches run on a grid of held shapes (``ShapeGrid``;
# Deploy.onednn_shape_grid when not given).
ONEDNN_SHAPE_GRID = SCHEMA["Deploy"]["onednn_shape_grid"].default
PRECISIONS = {"paddle": ("fp32", "bf16", "fp16"), "onnx": ("fp32", "fp16", "int8")}


def _backend_entry(manifest, backend):
    backends = manifest.get("backends") or {}
    if backend not in backends:
        raise UnservableExportError(f"this export has no {backend!r} backend (it has {sorted(backends)}); "
                                    f"use --backend {' or '.join(sorted(backends)) or '?'} or re-export with "
                                    f"Export.format including {backend}")
    entry = backends[backend]
    return entry if isinstance(entry, dict) else {}


def _output_names(manifest, backend=None):
    """The backend's own output list when the manifest has one (seq2seq: ``["tokens"]``)."""
    entry = ((manifest.get("backends") or {}).get(backend) or {}) if backend else {}
    outs = entry.get("outputs") or manifest.get("outputs") or []
    return [o if isinstance(o, str) else o["name"] for o in outs]


def input_names(manifest):
    """The export's declared input names, in order (the task's ``input_specs``); an export
    written before manifests listed them has the token-row contract's two."""
    names = [i["name"] for i in manifest.get("inputs") or []]
    return names or ["input_ids", "seq_len"]


def onednn_cache_capacity(params_bytes, precision, budget=None):
    """How many input shapes Paddle may keep oneDNN kernels for, within the memory budget.

    Paddle Inference honours the capacity (a new shape past it drops one held shape), but each
    shape it keeps holds its kernels' weights reordered for that shape: a copy of the weights
    per shape (bf16: at half the size), so a capacity counted in shapes alone lets a large model
    fill the machine.  A shape outside the cache costs a weight reorder again, not a leak.
    ``budget`` (bytes, ``Deploy.onednn_cache_bytes``) defaults to ``ONEDNN_CACHE_BUDGET_BYTES``
    (read at call time, so tests and benchmarks can set it)."""
    budget = ONEDNN_CACHE_BUDGET_BYTES if budget is None else budget
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ConfigError(f"Deploy.onednn_cache_bytes is {budget!r}; it must be a whole number "
                          f"of bytes, at least 1 (default {ONEDNN_CACHE_BUDGET_BYTES}: a bound "
                          f"on the memory Paddle's oneDNN shape cache holds)")
    copy_bytes = max(1, params_bytes // 2 if precision == "bf16" else params_bytes)
    return int(max(1, min(ONEDNN_CACHE_CAPACITY, budget // copy_bytes)))


GRID_TOP_ROWS = 16  # the most rows a grid shape has (larger batches run in pieces)
GRID_MIN_WIDTH = 16  # the narrowest grid width
GRID_MIN_CAPACITY = 9  # fewer held shapes: a grid pads too coarsely, batches run at their own shape
# A shared-weights grid's most rows: one digit, so no two of its shapes join to one cache key.
SHARED_GRID_TOP_ROWS = 8


def grid_cover(axis, value):
    """The smallest value of a sorted grid ``axis`` at least ``value``; None past its end."""
    return next((g for g in axis if g >= value), None)


def grid_axes(capacity, max_rows, max_width):
    """(rows, widths) of a shape grid of at most ``capacity`` shapes: widths halve from
    ``max_width`` (multiples of 8, at least ``GRID_MIN_WIDTH``), rows grow geometrically from
    1 to ``min(max_rows, GRID_TOP_ROWS)``; about as many of each (square root of the capacity).
    Chosen by rule, not tuned per model: docs/PRECISION.md (Memory) has the measurements."""
    widths = [int(max_width)]
    while len(widths) * len(widths) < capacity and widths[-1] // 2 >= GRID_MIN_WIDTH:
        widths.append(-(-(widths[-1] // 2) // 8) * 8)
    widths = sorted(set(widths))
    top = max(1, min(int(max_rows), GRID_TOP_ROWS))
    n_rows = max(1, min(top, capacity // len(widths)))
    if n_rows == 1:
        rows = [top]
    else:
        rows = sorted({max(1, round(top ** (k / (n_rows - 1)))) for k in range(n_rows)})
    return rows, widths


def shared_grid_axes(max_rows, max_width):
    """(rows, widths) of the grid an engine with shared weights runs (``PaddleEngine``,
    ``shared_weights``): rows 1, 2, 4, 8 (up to ``max_rows``, which is a row count too), widths
    on a ladder of half octaves from ``GRID_MIN_WIDTH`` (16, 24, 32, 48, 64, 96, ...) below
    ``max_width``, and ``max_width``.  Such a cache holds one weight copy whatever the shapes,
    so the grid is as fine as its warm-up allows (one pass runs every shape), not what copies
    fit.  Paddle joins a shape's dimensions without a separator in its cache keys with
    capacity 0 ([1, 61] and [16, 1] are one key, and the second fails): rows of one digit
    cannot make two grid shapes one key."""
    top = max(1, min(int(max_rows), SHARED_GRID_TOP_ROWS))
    rows = sorted({r for r in (1, 2, 4, 8) if r < top} | {top})
    octaves = [GRID_MIN_WIDTH << k for k in range(int(max_width).bit_length())]
    # a rung within an eighth of max_width would pad next to nothing: left out
    ladder = sorted(w for octave in octaves for w in (octave, octave * 3 // 2)
                    if 8 * w < 7 * max_width)
    return rows, ladder + [int(max_width)]


class ShapeGrid:
    """The batch shapes a Paddle oneDNN engine runs: a fixed grid of (rows, width) shapes
    (``rows`` x ``widths``), every one of which Paddle keeps once run: with one weight copy
    for all of them (``shared_grid_axes``), or within the cache's capacity of weight copies
    (``grid_axes``).

    Each shape Paddle caches costs its kernels (and, with a capacity, a weight reorder) when
    first run (``onednn_cache_capacity``); a server's batches have a new exact shape nearly
    every time, and past a capacity Paddle drops an arbitrary held shape (not the least
    recently used).  On a grid every batch, once warm, runs at a held shape: padded up to the next grid width
    (pad tokens) and the next grid rows (copies of its first row, their answers dropped); the
    models are padding- and batch-invariant (admission checks both).  ``costs`` holds each
    shape's seconds, which the server's batcher plans with: the fastest run of the shape seen
    so far (``observe``: warm-up passes, then every batch), so a figure a busy start-up
    inflated falls once the shape runs on a quieter host.  A batch with more rows than the
    grid's most runs in pieces (``Predictor._run_rows``, ``Predictor.run_engine``); one no
    grid shape covers otherwise runs at its own shape (``off_grid`` counts them).  One grid per process, as Paddle's
    cache is: clones share it."""

    def __init__(self, rows, widths):
        self.rows, self.widths = list(rows), list(widths)
        self.costs = {}
        self.off_grid = 0  # batches no grid shape covers, run at their own shape
        self._lock = threading.Lock()  # worker threads observe their runs concurrently

    def shapes(self):
        return [(r, w) for r in self.rows for w in self.widths]

    def fit(self, rows, width):
        """(rows, width) a batch of ``rows`` texts, the longest ``width``, runs at."""
        r, w = grid_cover(self.rows, rows), grid_cover(self.widths, width)
        if r is None or w is None:
            self.off_grid += 1
            return rows, width
        return r, w

    def cost(self, rows, width):
        """Measured seconds of the grid shape such a batch runs at; None when it runs off the
        grid or the shape was not timed."""
        return self.costs.get((grid_cover(self.rows, rows), grid_cover(self.widths, width)))

    def observe(self, rows, width, seconds):
        """A run of (rows, width) took ``seconds``: keep it as the shape's cost when it is the
        fastest yet.  The least time, not the latest or a mean: other work on the host (and
        the shape's first run, which sets its kernels up) only ever slows a run, and the
        batcher compares shapes with each other, so their uncontended costs are what it needs.
        Shapes off the grid are not kept."""
        if rows not in self.rows or width not in self.widths:
            return
        with self._lock:
            held = self.costs.get((rows, width))
            if held is None or seconds < held:
                self.costs[(rows, width)] = seconds

    def slowed(self):
        """Shapes timed slower than a shape that covers them (as many rows or more, as wide or
        wider): that one does more work, so the smaller shape's run was slowed (by other work
        on the host, or by being the engine's first run).  Not so for a decode loop, whose rows
        end at their own steps: its grid (weight copies) is not checked this way."""
        with self._lock:
            costs = dict(self.costs)
        return [(r, w) for (r, w), t in sorted(costs.items())
                if any(t > t2 for (r2, w2), t2 in costs.items()
                       if r2 >= r and w2 >= w and (r2, w2) != (r, w))]

    def times_ms(self):
        """{"ROWSxWIDTH": milliseconds} of the shapes timed, in grid order (logs, metrics)."""
        with self._lock:
            return {f"{r}x{w}": round(1000 * t, 1) for (r, w), t in sorted(self.costs.items())}


def check_precision(manifest, backend, precision):
    """Refuse a precision the backend cannot run or the export did not produce.

    ``manifest.precisions`` maps each backend to the precisions exported for it.
    """
    if precision not in PRECISIONS[backend]:
        exported = manifest.get("precisions") or {}
        elsewhere = [b for b in sorted(exported) if b != backend and precision in exported[b]]
        # worded for the command line and the library both (Predictor's backend, precision)
        fix = (f"this export has {precision} for backend {elsewhere[0]!r}: ask for backend "
               f"{elsewhere[0]!r} with precision {precision!r} (--backend {elsewhere[0]} "
               f"--precision {precision})" if elsewhere
               else f"choose one of {list(PRECISIONS[backend])}")
        raise ConfigError(f"precision {precision!r} is not available for backend {backend!r}; "
                         f"{fix}")
    listed = (manifest.get("precisions") or {}).get(backend, ["fp32"])
    if precision not in listed:
        raise UnservableExportError(f"precision {precision!r} was not exported for backend {backend!r} "
                                    f"(manifest lists {listed}); re-export with "
                                    f"-o Export.precision=[fp32,{precision}]")


class PaddleEngine:
    """Paddle Inference predictor over ``paddle/model.json`` + ``paddle/model.pdiparams``.

    CPU: ``threads`` math threads, oneDNN unless the manifest's ``settings.fp32.enable_onednn``
    is false; ``bf16`` via oneDNN bfloat16 kernels.  oneDNN's shape cache: with a grid
    (``onednn_shape_grid``) and ``shared_weights`` (default: unless the task generates, whose
    decode loop runs shapes of its own at every step), capacity 0, one weight copy and the
    fine grid of ``shared_grid_axes``; otherwise a capacity in weight copies
    (``onednn_cache_capacity``) and the coarser grid of ``grid_axes`` that fits it.
    GPU: ``fp16`` runs in half precision; ``tensorrt=True`` adds TensorRT subgraphs with
    the dynamic shape ranges the exporter derived from the length profile
    (``manifest.shape_ranges``) — a shape outside them is an error, not a silent re-build.
    """

    def __init__(self, export_dir, manifest, device="cpu", precision="fp32", threads=1,
                 gpu_id=0, tensorrt=False, onednn_cache_bytes=None, onednn_shape_grid=None,
                 max_rows=64, max_width=None, shared_weights=None, _predictor=None):
        self.output_names = _output_names(manifest, "paddle")
        self.inputs = list(manifest.get("inputs") or [])
        self.input_names = input_names(manifest)
        if _predictor is not None:
            self._predictor, self.settings, self.shape_grid = _predictor
            return
        self.shape_grid = None  # oneDNN on CPU: a ShapeGrid
        import paddle.inference as pi

        entry = _backend_entry(manifest, "paddle")
        check_precision(manifest, "paddle", precision)
        model = require_listed(export_dir, manifest, entry.get("model", "paddle/model.json"))
        params = require_listed(export_dir, manifest, entry.get("params", "paddle/model.pdiparams"))
        if device == "gpu":  # bf16 -> Bfloat16; TensorRT via paddle.tensorrt
            gpu.require_cuda_paddle()
            prec = gpu.gpu_precision_type(precision)
            if tensorrt:  # PIR programs take TensorRT only through paddle.tensorrt.convert
                self._trt_dir = tempfile.TemporaryDirectory(prefix="ppvarlen-trt-")
                prefix = gpu.convert_tensorrt(model, manifest, input_names(manifest), precision,
                                              self._trt_dir.name)
                model, params = prefix + ".json", prefix + ".pdiparams"
            config = pi.Config(model, params)
            config.enable_use_gpu(256, gpu_id, prec)
        else:
            config = pi.Config(model, params)
            cache_capacity = None
            if precision == "fp16":
                raise ConfigError("fp16 has no CPU kernels in Paddle Inference; use bf16 on CPU, "
                                 "or --backend onnx --precision fp16")
            config.disable_gpu()
            # The exporter may turn oneDNN off for a graph it slows down (settings.fp32);
            # bf16 needs it.  Default on: oneDNN's kernels are what make Paddle Inference
            # faster than eager on CPU (docs/BENCHMARKS.md).
            settings = (entry.get("settings") or {}).get(precision) or {}
            if precision == "bf16" or settings.get("enable_onednn", True):
                config.enable_onednn()
                # oneDNN caches kernels (and a weight copy) per input shape; every batch can
                # have a new shape: bound the cache in bytes.
                cache_capacity = onednn_cache_capacity(os.path.getsize(params), precision,
                                                       onednn_cache_bytes)
                grid = ONEDNN_SHAPE_GRID if onednn_shape_grid is None else onednn_shape_grid
                if not isinstance(grid, bool):
                    raise ConfigError(f"Deploy.onednn_shape_grid is {grid!r}; it must be true "
                                      f"or false (default {str(ONEDNN_SHAPE_GRID).lower()})")
                if shared_weights is None:  # a decode loop's steps are shapes of their own
                    shared_weights = not get_task(manifest["task"]).generates
                if grid and max_width and shared_weights:
                    # capacity 0: one weight copy for every shape, each shape's kernels kept;
                    # the grid is every shape this engine runs, so they stay few
                    cache_capacity = 0
                    self.shape_grid = ShapeGrid(*shared_grid_axes(max_rows, max_width))
                elif grid and cache_capacity >= GRID_MIN_CAPACITY and max_width:
                    self.shape_grid = ShapeGrid(*grid_axes(cache_capacity, max_rows, max_width))
                config.set_onednn_cache_capacity(cache_capacity)
            config.set_cpu_math_library_num_threads(int(threads))
            if precision == "bf16":
                config.enable_onednn_bfloat16()
        config.disable_glog_info()
        self.settings = {"backend": "paddle", "device": device, "precision": precision,
                         "model": "tensorrt" if tensorrt else os.path.relpath(model, export_dir),
                         "tensorrt": bool(tensorrt),
                         # read back from the Config Paddle Inference runs with
                         "onednn": bool(config.onednn_enabled()),
                         "math_threads": int(config.cpu_math_library_num_threads()),
                         "onednn_cache_capacity": None if device == "gpu" else cache_capacity,
                         "onednn_shared_weights": device != "gpu" and cache_capacity == 0,
                         "onednn_shape_grid": self.shape_grid and [self.shape_grid.rows,
                                                                    self.shape_grid.widths],
                         "onednn_bfloat16": device != "gpu" and precision == "bf16"}
        self._predictor = pi.create_predictor(config)

    def clone(self):
        return PaddleEngine(None, {"outputs": self.output_names, "inputs": self.inputs},
                            _predictor=(self._predictor.clone(), self.settings,
                                        self.shape_grid))

    def graph_inputs(self):
        """The input names the loaded program takes (admission compares them with the manifest)."""
        return list(self._predictor.get_input_names())

    def run(self, *arrays):
        """``arrays``: the manifest's declared inputs, in order (the task's ``input_specs``)."""
        p = self._predictor
        feeds = dict(zip(self.input_names, arrays))
        for pos, name in enumerate(p.get_input_names()):
            arr = feeds.get(name, arrays[pos])
            p.get_input_handle(name).copy_from_cpu(np.ascontiguousarray(arr))
        p.run()
        arrays = [p.get_output_handle(n).copy_to_cpu() for n in p.get_output_names()]
        return dict(zip(self.output_names or [str(i) for i in range(len(arrays))], arrays))


def _ort_session(export_dir, manifest, rel, device, threads, gpu_id):
    """(onnxruntime session over the manifest-listed file ``rel`` (CPU or CUDA), its settings)."""
    import onnxruntime as ort

    path = require_listed(export_dir, manifest, rel)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # unused-initializer warnings from paddle2onnx graphs
    if device == "gpu":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise ConfigError("device 'gpu' was requested but onnxruntime has no "
                             "CUDAExecutionProvider; install onnxruntime-gpu or use "
                             "--device cpu")
        providers = [("CUDAExecutionProvider", {"device_id": gpu_id}), "CPUExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    # The exporter records graph optimizers onnxruntime must skip for this graph (e.g. the
    # NCHWc transformer segfaults onnxruntime 1.32 on the fp16 BiGRU-CRF).
    entry = _backend_entry(manifest, "onnx")
    disabled = list(entry.get("session", {}).get("disabled_optimizers", []))
    session = ort.InferenceSession(path, opts, providers=providers, disabled_optimizers=disabled)
    used = session.get_session_options()  # read back from the session that runs
    return session, {"model": rel, "providers": session.get_providers(),
                     "intra_op_threads": used.intra_op_num_threads,
                     "inter_op_threads": used.inter_op_num_threads,
                     "graph_optimization_level": str(used.graph_optimization_level),
                     "disabled_optimizers": sorted(disabled)}


class OnnxEngine:
    """onnxruntime session over ``onnx/model.onnx`` (or ``model_fp16.onnx``), CPU or CUDA."""

    def __init__(self, export_dir, manifest, device="cpu", precision="fp32", threads=1,
                 gpu_id=0, _session=None):
        self.output_names = _output_names(manifest)
        self.inputs = list(manifest.get("inputs") or [])
        self.input_names = input_names(manifest)
        if _session is not None:
            self._session, self.settings, self._source = _session
            return
        self._source = (export_dir, manifest, gpu_id)  # what another session is built from
        entry = _backend_entry(manifest, "onnx")
        check_precision(manifest, "onnx", precision)
        rel = entry.get(f"model_{precision}", f"onnx/model_{precision}.onnx")
        rel = entry.get("model", "onnx/model.onnx") if precision == "fp32" else rel
        self._session, session_settings = _ort_session(export_dir, manifest, rel, device,
                                                       threads, gpu_id)
        self.settings = {"backend": "onnx", "device": device, "precision": precision,
                         **session_settings}

    def clone(self):
        # InferenceSession.run is thread-safe; clones share the loaded graph and weights.
        return OnnxEngine(None, {"outputs": self.output_names, "inputs": self.inputs},
                          _session=(self._session, self.settings, self._source))

    def with_threads(self, threads):
        """A second session of the same graph and precision on ``threads`` math threads: a
        session's thread count is fixed when it is built.  Its own copy of the weights."""
        export_dir, manifest, gpu_id = self._source
        return OnnxEngine(export_dir, manifest, self.settings["device"],
                          self.settings["precision"], threads, gpu_id)

    def graph_inputs(self):
        return [i.name for i in self._session.get_inputs()]

    def run(self, *arrays):
        """``arrays``: the manifest's declared inputs, in order (the task's ``input_specs``)."""
        feeds = dict(zip(self.input_names, arrays))
        feed = {i.name: feeds.get(i.name, arrays[pos])
                for pos, i in enumerate(self._session.get_inputs())}
        arrays = self._session.run(None, feed)
        return dict(zip(self.output_names or [str(i) for i in range(len(arrays))], arrays))


class OnnxGreedyEngine:
    """Seq2seq over ``onnx/encoder.onnx`` + ``onnx/decoder_step.onnx``: greedy loop in numpy.

    ``run(src_ids, src_len) -> {"output_ids": [ids without BOS/EOS per row]}``; each row's
    length limit comes from the manifest's ``decoding`` section, the same rule as the model.
    """

    def __init__(self, export_dir, manifest, device="cpu", precision="fp32", threads=1,
                 gpu_id=0, _sessions=None):
        self.decoding = manifest["decoding"]
        if _sessions is not None:
            self._encoder, self._step, self.settings = _sessions
            return
        entry = _backend_entry(manifest, "onnx")
        check_precision(manifest, "onnx", precision)  # seq2seq exports list fp32 only
        (self._encoder, encoder_settings), (self._step, step_settings) = (
            _ort_session(export_dir, manifest, entry.get(part, f"onnx/{part}.onnx"), device,
                         threads, gpu_id) for part in ("encoder", "decoder_step"))
        self.settings = {"backend": "onnx", "device": device, "precision": precision,
                         "decode": "greedy_numpy", "encoder": encoder_settings,
                         "decoder_step": step_settings}

    def clone(self):
        return OnnxGreedyEngine(None, {"decoding": self.decoding},
                                _sessions=(self._encoder, self._step, self.settings))

    def graph_inputs(self):
        """The encoder's inputs: the source rows the manifest declares."""
        return [i.name for i in self._encoder.get_inputs()]

    @staticmethod
    def _run(session, names, arrays):
        """Feed by the spec's input names, by position for a graph that renamed them."""
        given = dict(zip(names, arrays))
        feed = {i.name: given.get(i.name, arrays[pos])
                for pos, i in enumerate(session.get_inputs())}
        return tuple(session.run(None, feed))

    def _encode(self, src_ids, src_len):
        return self._run(self._encoder, ("src_ids", "src_len"), (src_ids, src_len))

    def _decode_step(self, *arrays):
        return self._run(self._step, STEP_INPUTS, arrays)

    def run(self, src_ids, src_len):
        d = self.decoding
        limits = length_limits(src_len, d["max_len_a"], d["max_len_b"], d.get("max_position"))
        ids = greedy_search(self._encode, self._decode_step, src_ids, src_len, d["bos_id"],
                            d["eos_id"], limits)
        return {"output_ids": ids}


def build_engine(export_dir, manifest, backend, tensorrt=False, onednn_cache_bytes=None,
                 onednn_shape_grid=None, max_rows=64, max_width=None, **kw):
    """The engine of ``backend`` for the export (``onednn_*`` and the grid's ``max_rows`` /
    ``max_width``: Paddle's only)."""
    if tensorrt and (backend != "paddle" or kw.get("device") != "gpu"):
        raise ConfigError("TensorRT runs only with --backend paddle --device gpu")
    if backend == "paddle":
        if max_width is None and manifest.get("max_len"):  # the widest row the export takes
            max_width = min(int(manifest["max_len"]),
                            int(manifest.get("max_position") or manifest["max_len"]))
        return PaddleEngine(export_dir, manifest, tensorrt=tensorrt,
                            onednn_cache_bytes=onednn_cache_bytes,
                            onednn_shape_grid=onednn_shape_grid, max_rows=max_rows,
                            max_width=max_width, **kw)
    if backend == "onnx" and _backend_entry(manifest, "onnx").get("decode") == "greedy_numpy":
        return OnnxGreedyEngine(export_dir, manifest, **kw)
    if backend == "onnx":
        return OnnxEngine(export_dir, manifest, **kw)
    raise ConfigError(f"unknown backend {backend!r}; choose paddle or onnx")
