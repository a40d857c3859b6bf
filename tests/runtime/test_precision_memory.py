"""Serving memory stays bounded whatever batch shapes arrive.

Paddle Inference with oneDNN keeps, for every input shape it caches, the kernels and (with a
cache capacity) a copy of the weight matrices reordered for that shape.  The engine runs a
classifier's batches on a fixed grid of shapes with capacity 0, one weight copy for all of
them; at their own shapes (no grid) it bounds the cache in bytes
(``backends.ONEDNN_CACHE_BUDGET_BYTES`` over the size of one weight copy).  The soak runs a
model with a few MB of weight matrices at every length 1..max_len and every batch size the
batcher forms here, in a child process of its own (the oneDNN cache is per process), and
checks how much anonymous memory (RssAnon) grew after a warm-up.  With a capacity counted in
shapes alone (64) it grows by about 64 weight copies.  ONNX Runtime keeps no such cache: its
case is a guard that it stays within the same headroom (it passed before the budget too).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HIDDEN = 512
LAYERS = 4
MAX_LEN = 40
MAX_ROWS = 4
BUDGET_COPIES = 3  # the child's budget: this many weight copies
HEADROOM_MIB = 96  # allocator slack and activations on top of the cached copies
# the shared-weights grid's slack: its 12 shapes' kernels; 12 weight copies would not fit it
SHARED_HEADROOM_MIB = 24


def _model(vocab_size):
    import paddle

    class MlpClassifier(paddle.nn.Layer):
        """Per-token MLP (sizeable weight matrices: what oneDNN copies per shape), masked mean."""

        def __init__(self):
            super().__init__()
            self.emb = paddle.nn.Embedding(vocab_size, HIDDEN)
            self.layers = paddle.nn.LayerList([paddle.nn.Linear(HIDDEN, HIDDEN)
                                               for _ in range(LAYERS)])
            self.out = paddle.nn.Linear(HIDDEN, 2)

        def forward(self, input_ids, seq_len, labels=None):
            h = self.emb(input_ids)
            for layer in self.layers:
                h = paddle.tanh(layer(h))
            positions = paddle.arange(paddle.shape(input_ids)[1]).unsqueeze(0)
            mask = (positions < seq_len.unsqueeze(1)).astype("float32").unsqueeze(-1)
            return self.out((h * mask).sum(1) / seq_len.astype("float32").unsqueeze(1))

    return MlpClassifier()


def _bf16_host():
    from paddle.base import core

    return bool(core.supports_bfloat16())


def _export_mlp(out, seed):
    import paddle

    from ppvarlen.config import load_config
    from ppvarlen.data.vocab import TextEncoder
    from ppvarlen.export.exporter import export_model
    from export_helpers import TEXTS

    paddle.seed(seed)
    encoder = TextEncoder.build(TEXTS, kind="char")
    model = _model(encoder.vocab_size)
    model.eval()
    meta = {"task": "classification", "model_name": "mlp", "label_names": ["neg", "pos"],
            "special_ids": encoder.special_ids, "max_len": MAX_LEN, "max_position": MAX_LEN,
            "long_text": "truncate", "length_profile": {"p50": 8, "p95": 30, "p99": 40,
                                                        "max": MAX_LEN}}
    cfg = load_config(overrides=["Data.corpus=sentiment", f"Data.max_len={MAX_LEN}"])
    precisions = ["fp32", "bf16"] if _bf16_host() else ["fp32"]
    export_model(model, meta, encoder, cfg, out, ("paddle", "onnx"), precisions, False)
    return out


@pytest.fixture(scope="module")
def mlp_export(tmp_path_factory):
    return _export_mlp(str(tmp_path_factory.mktemp("mlp") / "export"), seed=0)


def _weight_copy_mib(export_dir, precision):
    params = os.path.getsize(os.path.join(export_dir, "paddle", "model.pdiparams"))
    return params / 2 ** 20 / (2 if precision == "bf16" else 1)


def _soak(export_dir, backend, precision, grid=False):
    """Run the child; its readings (MiB)."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                           os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, __file__, export_dir, backend, precision, str(grid)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


CASES = [("paddle", "fp32", False), ("paddle", "bf16", False), ("paddle", "fp32", True),
         ("paddle", "bf16", True), ("onnx", "fp32", False)]


@pytest.mark.parametrize("backend,precision,grid", CASES)
def test_memory_stays_bounded_over_every_batch_shape(mlp_export, backend, precision, grid):
    """``grid`` False: every batch at its own shape (the capacity bounds the cache); True:
    the default shape grid, which never forms more shapes than the capacity."""
    if precision == "bf16" and not _bf16_host():
        pytest.skip("this CPU has no bf16 kernels (paddle.base.core.supports_bfloat16)")
    r = _soak(mlp_export, backend, precision, grid)
    if grid:
        assert r["capacity"] == 0 and 1 < r["shapes"] <= r["grid"]  # only grid shapes ran
    else:
        assert r["shapes"] > 64  # more shapes than a capacity of 64 shapes holds
    grown = r["after"] - r["warm"]
    copy = _weight_copy_mib(mlp_export, precision)
    if backend == "paddle" and grid:  # one weight copy, whatever the grid's shapes
        bound = copy + SHARED_HEADROOM_MIB
    else:  # the most copies the cache may hold: the budget's, or one per shape the run formed
        held = min(BUDGET_COPIES, r["shapes"]) if backend == "paddle" else 0
        bound = held * copy + HEADROOM_MIB
    assert grown <= bound, (f"RssAnon grew {grown:.0f} MiB over {r['shapes']} batch shapes "
                            f"(capacity {r['capacity']}, a weight copy {copy:.1f} MiB); bound "
                            f"{bound:.0f} MiB; readings {r}")


def test_budget_sets_the_capacity_in_weight_copies():
    from ppvarlen.runtime.backends import ONEDNN_CACHE_CAPACITY, onednn_cache_capacity

    mib = 2 ** 20
    assert onednn_cache_capacity(400 * mib, "fp32", budget=1024 * mib) == 2
    assert onednn_cache_capacity(400 * mib, "bf16", budget=1024 * mib) == 5
    assert onednn_cache_capacity(4000 * mib, "fp32", budget=1024 * mib) == 1  # never 0: no cache
    assert onednn_cache_capacity(mib, "fp32", budget=1024 * mib) == ONEDNN_CACHE_CAPACITY


def test_deploy_onednn_cache_bytes_sets_the_served_capacity(mlp_export):
    from ppvarlen.config import ConfigError
    from ppvarlen.runtime.predictor import Predictor
    from ppvarlen.serve.server import app_from_config
    from ppvarlen.serve.dataplane import deploy_settings

    copy_bytes = os.path.getsize(os.path.join(mlp_export, "paddle", "model.pdiparams"))
    deploy = deploy_settings(backend="paddle", precision="fp32", onednn_cache_bytes=2 * copy_bytes,
                             onednn_shape_grid=False)
    app = app_from_config(mlp_export, deploy)
    served = app.state.app_state.predictor
    assert served.engine.settings["onednn_cache_capacity"] == 2  # two weight copies fit
    assert served.engine.settings["onednn_shared_weights"] is False
    for bad in (0, -1):
        with pytest.raises(ConfigError, match=r"Deploy\.onednn_cache_bytes is -?\d+; it must"):
            Predictor(mlp_export, "paddle", precision="fp32", onednn_cache_bytes=bad)


def test_the_shape_grid_fits_the_cache_and_covers_every_batch():
    from ppvarlen.runtime.backends import ShapeGrid, grid_axes

    assert grid_axes(9, 64, 256) == ([1, 4, 16], [64, 128, 256])
    assert grid_axes(4, 64, 40) == ([1, 16], [24, 40])  # halved width rounded up to 8
    assert grid_axes(9, 2, 256) == ([1, 2], [64, 128, 256])  # rows never past max_batch_size
    for capacity in range(4, 65):
        for max_rows, max_width in ((64, 256), (8, 512), (1, 40), (64, 16)):
            rows, widths = grid_axes(capacity, max_rows, max_width)
            assert len(rows) * len(widths) <= capacity  # Paddle never drops a grid shape
            assert rows[0] == 1 or rows == [min(max_rows, 16)]
            assert rows[-1] == min(max_rows, 16) and widths[-1] == max_width
    grid = ShapeGrid(*grid_axes(9, 64, 256))
    assert grid.fit(3, 70) == (4, 128)
    assert grid.fit(1, 64) == (1, 64) and grid.fit(16, 256) == (16, 256)
    assert grid.fit(17, 10) == (17, 10) and grid.off_grid == 1  # too many rows: in pieces
    grid.costs = {shape: 0.001 * shape[0] * shape[1] for shape in grid.shapes()}
    assert grid.cost(3, 70) == pytest.approx(0.001 * 4 * 128)
    assert grid.cost(17, 10) is None


def test_a_shared_weights_grid_is_fine_and_no_two_shapes_share_a_cache_key():
    """With capacity 0 Paddle joins a shape's dimensions without a separator in its oneDNN
    cache keys ([1, 61] and [16, 1] collide, and the second run fails): no two grid shapes may
    join to the same digits, in either order of rows and width."""
    from ppvarlen.runtime.backends import GRID_MIN_WIDTH, shared_grid_axes

    assert shared_grid_axes(64, 256) == ([1, 2, 4, 8], [16, 24, 32, 48, 64, 96, 128, 192, 256])
    assert shared_grid_axes(3, 130) == ([1, 2, 3], [16, 24, 32, 48, 64, 96, 130])  # 128: ~130
    assert shared_grid_axes(1, 16) == ([1], [16])
    for max_rows in (1, 2, 3, 5, 8, 9, 16, 64):
        for max_width in list(range(8, 300)) + [384, 512, 513, 1000, 1024, 2048, 4096]:
            rows, widths = shared_grid_axes(max_rows, max_width)
            assert rows[-1] == min(max_rows, 8) and widths[-1] == max_width
            assert all(a < b for a, b in zip(widths, widths[1:]))
            assert all(w >= GRID_MIN_WIDTH for w in widths[:-1])
            for joined in (lambda r, w: f"{r}{w}", lambda r, w: f"{w}{r}"):
                keys = [joined(r, w) for r in rows for w in widths]
                assert len(set(keys)) == len(keys), (max_rows, max_width)


def test_batches_on_the_grid_keep_every_answer(mlp_export):
    """Batches of every size and width through a predictor that pads them up to its grid's
    shapes answer as one that runs each at its own shape; the copies' rows are not answered
    and their tokens are not counted as real; warm-up times every grid shape once."""
    from ppvarlen.config import ConfigError
    from ppvarlen.runtime.predictor import Predictor

    gridded = Predictor(mlp_export, "paddle", precision="fp32")  # the default
    exact = Predictor(mlp_export, "paddle", precision="fp32", onednn_shape_grid=False)
    grid = gridded.engine.shape_grid
    assert exact.engine.shape_grid is None and grid is not None
    assert gridded.engine.settings["onednn_shape_grid"] == [grid.rows, grid.widths]
    # a classifier's graph: capacity 0, one weight copy for every grid shape
    assert gridded.engine.settings["onednn_cache_capacity"] == 0
    assert gridded.engine.settings["onednn_shared_weights"] is True
    assert grid.rows == [1, 2, 4, 8] and grid.widths == [16, 24, 32, MAX_LEN]
    gridded.warmup()
    assert sorted(grid.costs) == sorted(grid.shapes()) and min(grid.costs.values()) > 0
    assert gridded.real_tokens == gridded.padded_tokens == 0  # warm-up is not traffic
    rng = np.random.RandomState(0)
    low = max(gridded.encoder.pad_id, gridded.encoder.unk_id) + 1
    real = 0
    for lengths in [(30, 20, 10, 5), (25, 3, 8), (9,), (30, 4), (12, 12, 1, 7), (20,), (40, 2),
                    tuple(range(1, 21))]:  # more rows than the grid's most: in pieces
        batch = [rng.randint(low, gridded.encoder.vocab_size, size=n).tolist() for n in lengths]
        real += sum(lengths)
        got, want = gridded._run_rows(batch), exact._run_rows(batch)
        assert len(got) == len(want) == len(lengths)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert gridded.real_tokens == exact.real_tokens == real
    assert gridded.padded_tokens > exact.padded_tokens and grid.off_grid == 0
    # a direct engine run of more rows than the grid's most (admission's, timing's) runs in
    # pieces on the grid too: one weight copy keeps any shape it runs for good
    ran, run = [], gridded.engine.run
    gridded.engine.run = lambda ids, *more: ran.append(ids.shape) or run(ids, *more)
    rows = [rng.randint(low, gridded.encoder.vocab_size, size=n).tolist()
            for n in (3, 17, 9, 30, 1, 5, 12, 8, 2, 40, 7)]
    (got, got_len), (want, want_len) = gridded.run_engine(rows), exact.run_engine(rows)
    gridded.engine.run = run
    assert set(ran) <= set(grid.shapes()) and len(ran) == 2 and grid.off_grid == 0
    np.testing.assert_array_equal(got_len, want_len)
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
    clone = gridded.clone()
    assert clone.engine.shape_grid is grid  # one grid per process: every worker's runs time it
    for bad in (2, "yes", 1.0):
        with pytest.raises(ConfigError, match=r"Deploy\.onednn_shape_grid is .*; it must"):
            Predictor(mlp_export, "paddle", precision="fp32", onednn_shape_grid=bad)


def test_pieces_of_a_batch_join_in_row_order_with_ragged_tails_padded():
    """A piece's per-row output can end at its own longest row (a Viterbi path): joined, the
    shorter pieces' rows get zeros past their length; outputs that are not per row (as many
    rows as the piece) are the first piece's."""
    from ppvarlen.runtime.predictor import _joined

    pieces = [({"tags": np.array([[1, 2, 3], [4, 5, 0]]), "crf": np.eye(2)}, np.array([3, 2])),
              ({"tags": np.array([[6]]), "crf": np.eye(2) * 2}, np.array([1]))]
    out, seq_len = _joined(pieces)
    np.testing.assert_array_equal(out["tags"], [[1, 2, 3], [4, 5, 0], [6, 0, 0]])
    np.testing.assert_array_equal(out["crf"], np.eye(2))
    np.testing.assert_array_equal(seq_len, [3, 2, 1])


def test_grid_costs_keep_each_shapes_fastest_run():
    """The batcher plans with each grid shape's fastest run seen: a slower run (other work on
    the host, a shape's first run) never raises it; shapes off the grid are not kept."""
    from ppvarlen.runtime.backends import ShapeGrid, grid_axes

    grid = ShapeGrid(*grid_axes(9, 64, 256))
    for seconds in (0.5, 0.2, 0.9):
        grid.observe(4, 128, seconds)
    assert grid.costs == {(4, 128): 0.2}
    grid.observe(3, 128, 0.01)  # a batch of 3 runs at 4 rows: (3, 128) is no grid shape
    grid.observe(17, 10, 0.01)  # off the grid
    grid.observe(1, 64, 0.0375)
    assert grid.costs == {(4, 128): 0.2, (1, 64): 0.0375}
    assert grid.times_ms() == {"1x64": 37.5, "4x128": 200.0}


def test_two_models_on_grids_of_one_weight_copy_answer_each_with_its_own_weights(
        mlp_export, tmp_path):
    """Two exports of one architecture, other weights, in one process and one thread (as a
    model repository's batchers may run them), batches alternating: with one weight copy for
    every shape, oneDNN's cache must not hand one model the other's weights.  Each answers as
    its ONNX Runtime export (another runtime, no shared cache) does."""
    from ppvarlen.runtime.predictor import Predictor

    other = _export_mlp(str(tmp_path / "other"), seed=1)
    first, second = (Predictor(e, "paddle", precision="fp32") for e in (mlp_export, other))
    assert first.engine.settings["onednn_shared_weights"]
    assert second.engine.settings["onednn_shared_weights"]
    references = [Predictor(e, "onnx", precision="fp32") for e in (mlp_export, other)]
    low = max(first.encoder.pad_id, first.encoder.unk_id) + 1
    batches = [[[low + (i * 7 + j) % 50 for j in range(n)] for i in range(rows)]
               for rows, n in ((1, 9), (3, 17), (2, 40), (4, 5), (1, 33))]
    for batch in batches * 2:
        answers = [p.run_engine(batch)[0] for p in (first, second)]
        expected = [r.run_engine(batch)[0] for r in references]
        for got, want in zip(answers, expected):
            for name in want:
                np.testing.assert_allclose(got[name], want[name], atol=1e-4)
        gap = max(float(np.abs(answers[0][n] - answers[1][n]).max()) for n in expected[0])
        assert gap > 1e-2  # the two models' answers are told apart


def test_a_grid_shape_timed_slower_than_a_larger_one_was_slowed():
    from ppvarlen.runtime.backends import ShapeGrid

    grid = ShapeGrid([1, 4], [16, 64])
    for (rows, width), seconds in {(1, 16): 0.01, (1, 64): 0.03, (4, 16): 0.02,
                                   (4, 64): 0.08}.items():
        grid.observe(rows, width, seconds)
    assert grid.slowed() == []
    grid.costs[(1, 16)] = 0.025  # above 4x16's 0.02: a burst during its run
    grid.costs[(1, 64)] = 0.09  # above 4x64's
    assert grid.slowed() == [(1, 16), (1, 64)]
    grid.costs[(4, 64)] = 5.0  # nothing covers the largest shape: warm-up runs it twice
    assert grid.slowed() == [(1, 16)]


def test_a_grid_of_weight_copies_times_its_shapes_after_setting_them_up(mlp_export,
                                                                       monkeypatch):
    """With a weight copy per shape a shape's first run reorders its weights: warm-up runs
    every shape once before the passes that time it (``COPY_GRID_PASSES``), and re-times no
    shape by size (a decode loop's cost need not grow with its shape)."""
    import time

    from ppvarlen.runtime import backends
    from ppvarlen.runtime.predictor import COPY_GRID_PASSES, Predictor

    init = backends.PaddleEngine.__init__
    monkeypatch.setattr(backends.PaddleEngine, "__init__",
                        lambda self, *a, **k: init(self, *a, **{**k, "shared_weights": False}))
    predictor = Predictor(mlp_export, "paddle", precision="fp32")
    grid, engine = predictor.engine.shape_grid, predictor.engine
    assert engine.settings["onednn_shared_weights"] is False
    runs, real_run = {}, engine.run

    def run(input_ids, *rest):
        shape = tuple(input_ids.shape)
        runs[shape] = runs.get(shape, 0) + 1
        if runs[shape] == 1:  # as a weight reorder slows a first run
            time.sleep(0.05)
        return real_run(input_ids, *rest)

    engine.run = run
    predictor.warmup()
    assert COPY_GRID_PASSES >= 2
    assert runs == {shape: COPY_GRID_PASSES for shape in grid.shapes()}, runs
    assert max(grid.costs.values()) < 0.05, grid.times_ms()


def test_a_busy_start_does_not_set_the_grid_costs(mlp_export):
    """A burst of other work during warm-up slows one shape's run: a shape timed slower than
    a larger one runs again, and so does the largest (nothing covers it), so neither keeps the
    slowed run; a served batch faster than a shape's cost lowers it (the figures of a start-up
    on a busy host fall once traffic runs the shapes)."""
    import time

    from ppvarlen.runtime.predictor import GRID_RETIME_ROUNDS, Predictor

    predictor = Predictor(mlp_export, "paddle", precision="fp32")
    grid, engine = predictor.engine.shape_grid, predictor.engine
    largest, inner = (grid.rows[-1], grid.widths[-1]), (grid.rows[0], grid.widths[-2])
    runs = {}
    real_run = engine.run

    def run(input_ids, *rest):
        shape = tuple(input_ids.shape)
        runs[shape] = runs.get(shape, 0) + 1
        if shape in (largest, inner) and runs[shape] == 1:  # the one timing pass
            time.sleep(0.5)
        return real_run(input_ids, *rest)

    engine.run = run
    predictor.warmup()
    # one weight copy: a first run costs about a held one, so one pass times every shape
    assert predictor.engine.settings["onednn_shared_weights"]
    assert sorted(grid.costs) == sorted(grid.shapes())
    assert runs[largest] == 2 and runs[inner] >= 2, runs
    assert grid.costs[largest] < 0.5 and grid.costs[inner] < 0.5, grid.times_ms()
    assert max(runs.values()) <= 1 + GRID_RETIME_ROUNDS  # re-runs are bounded

    grid.costs[(1, grid.widths[0])] = 10.0  # as a start-up on a busy host may have timed it
    low = max(predictor.encoder.pad_id, predictor.encoder.unk_id) + 1
    predictor._run_rows([[low] * (grid.widths[0] - 1)])
    assert grid.costs[(1, grid.widths[0])] < 10.0
    assert predictor.real_tokens == grid.widths[0] - 1  # traffic is counted as before


def _child(export_dir, backend, precision, grid):
    """Warm up on one batch, then every length 1..MAX_LEN at every batch size 1..MAX_ROWS."""
    from ppvarlen.runtime import backends
    from ppvarlen.runtime.predictor import Predictor

    copy_bytes = int(_weight_copy_mib(export_dir, precision) * 2 ** 20)
    backends.ONEDNN_CACHE_BUDGET_BYTES = BUDGET_COPIES * copy_bytes  # the grid's ignores it
    p = Predictor(export_dir, backend, precision=precision, max_batch_size=MAX_ROWS,
                  onednn_shape_grid=grid == "True")
    rng = np.random.RandomState(0)
    low = max(p.encoder.pad_id, p.encoder.unk_id) + 1

    def rows(n, k):
        return rng.randint(low, p.encoder.vocab_size, size=(k, n)).tolist()

    def rss_anon_mib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("RssAnon")) / 1024

    for _ in range(3):
        p.run_engine(rows(MAX_LEN, MAX_ROWS))
    warm = rss_anon_mib()
    shapes, run = set(), p.engine.run

    def recording_run(input_ids, *more):
        shapes.add(input_ids.shape)
        return run(input_ids, *more)
    p.engine.run = recording_run
    for k in range(1, MAX_ROWS + 1):
        for n in range(1, MAX_LEN + 1):
            p.run_engine(rows(n, k))
    print(json.dumps({"warm": warm, "after": rss_anon_mib(), "shapes": len(shapes),
                      "capacity": p.engine.settings.get("onednn_cache_capacity"),
                      "grid": len(getattr(p.engine, "shape_grid", None) and
                                  p.engine.shape_grid.shapes() or [])}))


if __name__ == "__main__":
    _child(*sys.argv[1:5])
