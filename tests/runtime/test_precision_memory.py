"""Serving memory stays bounded whatever batch shapes arrive.

Paddle Inference with oneDNN keeps, for every input shape it caches, the kernels and a copy of
the weight matrices reordered for that shape; the engine bounds that cache in bytes
(``backends.ONEDNN_CACHE_BUDGET_BYTES`` over the size of one weight copy).  The soak runs a model
with a few MB of weight matrices at every length 1..max_len and every batch size the batcher
forms here, in a child process of its own (the oneDNN cache is per process), and checks how
much anonymous memory (RssAnon) grew after a warm-up.  With a capacity counted in shapes alone
(64) it grows by about 64 weight copies.  ONNX Runtime keeps no such cache: its case is a guard
that it stays within the same headroom (it passed before the budget too).
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


@pytest.fixture(scope="module")
def mlp_export(tmp_path_factory):
    import paddle

    from ppvarlen.config import load_config
    from ppvarlen.data.vocab import TextEncoder
    from ppvarlen.export.exporter import export_model
    from export_helpers import TEXTS

    paddle.seed(0)
    encoder = TextEncoder.build(TEXTS, kind="char")
    model = _model(encoder.vocab_size)
    model.eval()
    meta = {"task": "classification", "model_name": "mlp", "label_names": ["neg", "pos"],
            "special_ids": encoder.special_ids, "max_len": MAX_LEN, "max_position": MAX_LEN,
            "long_text": "truncate", "length_profile": {"p50": 8, "p95": 30, "p99": 40,
                                                        "max": MAX_LEN}}
    cfg = load_config(overrides=["Data.corpus=sentiment", f"Data.max_len={MAX_LEN}"])
    out = str(tmp_path_factory.mktemp("mlp") / "export")
    precisions = ["fp32", "bf16"] if _bf16_host() else ["fp32"]
    export_model(model, meta, encoder, cfg, out, ("paddle", "onnx"), precisions, False)
    return out


def _weight_copy_mib(export_dir, precision):
    params = os.path.getsize(os.path.join(export_dir, "paddle", "model.pdiparams"))
    return params / 2 ** 20 / (2 if precision == "bf16" else 1)


def _soak(export_dir, backend, precision):
    """Run the child; its readings (MiB)."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                           os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, __file__, export_dir, backend, precision],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


CASES = [("paddle", "fp32"), ("paddle", "bf16"), ("onnx", "fp32")]


@pytest.mark.parametrize("backend,precision", CASES)
def test_memory_stays_bounded_over_every_batch_shape(mlp_export, backend, precision):
    if precision == "bf16" and not _bf16_host():
        pytest.skip("this CPU has no bf16 kernels (paddle.base.core.supports_bfloat16)")
    r = _soak(mlp_export, backend, precision)
    assert r["shapes"] > 64  # more shapes than a capacity of 64 shapes holds
    grown = r["after"] - r["warm"]
    copy = _weight_copy_mib(mlp_export, precision)
    # the most weight copies the cache may hold: the budget's, or one per shape the run formed
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
    deploy = deploy_settings(backend="paddle", precision="fp32", onednn_cache_bytes=2 * copy_bytes)
    app = app_from_config(mlp_export, deploy)
    served = app.state.app_state.predictor
    assert served.engine.settings["onednn_cache_capacity"] == 2  # two weight copies fit
    for bad in (0, -1):
        with pytest.raises(ConfigError, match=r"Deploy\.onednn_cache_bytes is -?\d+; it must"):
            Predictor(mlp_export, "paddle", precision="fp32", onednn_cache_bytes=bad)


def test_shape_cache_pads_up_to_a_held_shape_within_the_slack():
    from ppvarlen.runtime.backends import ShapeCache

    cache = ShapeCache(capacity=2, slack=2.0)
    assert cache.fit(4, 30) == (4, 32)  # nothing held: a new shape, on the coarse grid
    assert cache.fit(3, 25) == (4, 32)  # 128 positions <= 2 x 75
    assert cache.fit(2, 20) == (2, 32)  # 128 > 2 x 40: a new shape (64 <= 2 x 40)
    assert cache.fit(2, 18) == (2, 32)  # the smallest covering shape, not (4, 32)
    assert cache.fit(5, 10) == (5, 10)  # (8, 32) > 2 x 50: its own; (4, 32) least recent
    assert cache.fit(4, 30) == (4, 32) and (cache.hits, cache.misses) == (2, 4)
    assert cache.fit(3, 25) == (4, 32)  # held again
    assert cache.fit(1, 250, max_width=256) == (1, 256)
    narrow = ShapeCache(capacity=2, slack=2.0)
    assert narrow.fit(1, 249, max_width=250) == (1, 250)  # never wider than the model takes


def test_padding_up_to_a_held_shape_keeps_every_answer(mlp_export):
    """Batches of every size and width through a predictor that pads them up to the shapes its
    oneDNN cache holds answer as one that runs each at its own shape; the copies' rows are
    not answered and their tokens are not counted as real."""
    from ppvarlen.config import ConfigError
    from ppvarlen.runtime.predictor import Predictor

    fitted = Predictor(mlp_export, "paddle", precision="fp32", onednn_shape_slack=4.0)
    exact = Predictor(mlp_export, "paddle", precision="fp32", onednn_shape_slack=1)
    assert exact.engine.shape_cache is None and fitted.engine.shape_cache.slack == 4.0
    assert fitted.engine.settings["onednn_shape_slack"] == 4.0
    rng = np.random.RandomState(0)
    low = max(fitted.encoder.pad_id, fitted.encoder.unk_id) + 1
    real = 0
    # held after each: + (4, 32); hit; + (1, 32); hit (4 x 32 <= 4 x 60); hit; hit
    for lengths in [(30, 20, 10, 5), (25, 3, 8), (9,), (30, 4), (12, 12, 1, 7), (20,)]:
        batch = [rng.randint(low, fitted.encoder.vocab_size, size=n).tolist() for n in lengths]
        real += sum(lengths)
        got, want = fitted._run_rows(batch), exact._run_rows(batch)
        assert len(got) == len(want) == len(lengths)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert (fitted.engine.shape_cache.hits, fitted.engine.shape_cache.misses) == (4, 2)
    assert fitted.real_tokens == exact.real_tokens == real
    assert fitted.padded_tokens > exact.padded_tokens
    clone = fitted.clone()
    assert clone.engine.shape_cache is fitted.engine.shape_cache  # one cache per process
    for bad in (0.5, True, "2"):
        with pytest.raises(ConfigError, match=r"Deploy\.onednn_shape_slack is .*; it must"):
            Predictor(mlp_export, "paddle", precision="fp32", onednn_shape_slack=bad)


def _child(export_dir, backend, precision):
    """Warm up on one batch, then every length 1..MAX_LEN at every batch size 1..MAX_ROWS."""
    from ppvarlen.runtime import backends
    from ppvarlen.runtime.predictor import Predictor

    copy_bytes = int(_weight_copy_mib(export_dir, precision) * 2 ** 20)
    backends.ONEDNN_CACHE_BUDGET_BYTES = BUDGET_COPIES * copy_bytes
    p = Predictor(export_dir, backend, precision=precision, max_batch_size=MAX_ROWS)
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
                      "capacity": p.engine.settings.get("onednn_cache_capacity")}))


if __name__ == "__main__":
    _child(*sys.argv[1:4])
