"""The trainer on the seq2seq task: tiny g2p runs end to end, metrics, checkpoint meta, eval."""
import json
import os

import pytest

from ppvarlen.config import ConfigError, load_config
from ppvarlen.data.collate import Collator
from ppvarlen.store_build import build_datasets
from ppvarlen.engine import evaluate_checkpoint, load_for_inference
from ppvarlen.engine import trainer as trainer_mod
from ppvarlen.engine.evaluate import predict
from ppvarlen.tasks import get_task
from ppvarlen.tasks.seq2seq import seq2seq_report

MODEL = {"name": "seq2seq", "hidden_size": 16, "num_layers": 1, "num_decoder_layers": 1,
         "num_heads": 2, "ffn_size": 32, "dropout": 0.0, "max_position": 80,
         "max_len_a": 1.2, "max_len_b": 4}


def tiny_cfg(out, data=None, model=None, **train):
    return load_config(data={
        "Global": {"output_dir": str(out), "seed": 5},
        "Data": dict({"corpus": "g2p", "limit": 48, "max_source_len": 24, "max_target_len": 40,
                      "target_tokenizer": "word", "long_text": "truncate", "max_tokens": 600},
                     **(data or {})),
        "Model": dict(MODEL, **(model or {})),
        "Optimizer": {"lr": 5e-3, "warmup_steps": 1},
        "Train": dict({"max_steps": 6, "log_every": 2, "eval_every": 3, "progress_bar": False,
                       "label_smoothing": 0.1}, **train),
    })


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("g2p")
    return str(out), trainer_mod.train(tiny_cfg(out))


def test_seq2seq_training_writes_metrics_and_decoding_meta(run):
    out, result = run
    assert result["steps"] == 6 and result["task"] == "seq2seq"
    for split in ("dev", "test"):
        m = result[split]
        assert m["num_examples"] == 48 and 0.0 <= m["seq_acc"] <= 1.0 and m["ter"] >= 0.0
    meta = json.load(open(os.path.join(out, "best", "meta.json")))
    assert meta["decoding"] == {"max_len_a": 1.2, "max_len_b": 4, "beam_size": 1,
                                "length_penalty": 1.0}
    assert meta["max_len"] == meta["max_source_len"] == 24 and meta["max_target_len"] == 40
    model, meta, encoder, _ = load_for_inference(os.path.join(out, "best"))
    # the output layer covers the target alphabet only (ids < output_size)
    assert meta["num_labels"] == encoder.output_size == model.output_size < encoder.vocab_size
    assert model.out_proj.weight.shape == [16, encoder.output_size]
    # both sides' padding is counted in the throughput figures
    tp = result["throughput"]
    assert 0 < tp["padding_efficiency"] <= 1 and tp["real_tokens_per_s"] > 0


def test_eval_batching_does_not_change_outputs_and_matches_recorded_dev(run):
    out, _ = run
    model, meta, encoder, cfg = load_for_inference(os.path.join(out, "best"))
    dev = build_datasets(cfg.Data, encoder=encoder, splits=("dev",)).dev
    collate = Collator(encoder.pad_id, fields=dev.store.fields)
    small = predict(model, dev, "seq2seq", collate, max_tokens=60)
    large = predict(model, dev, "seq2seq", collate, max_tokens=100_000)
    assert small == large and len(small) == len(dev)
    limits = [int(1.2 * len(dev[i]["src_ids"])) + 4 for i in range(len(dev))]
    assert all(len(h) < lim for h, lim in zip(small, limits))  # EOS counts towards the limit
    again = evaluate_checkpoint(cfg, os.path.join(out, "best"), "dev")
    assert again["seq_acc"] == meta["metrics"]["dev"]["seq_acc"]
    assert again["ter"] == pytest.approx(meta["metrics"]["dev"]["ter"])
    cfg_beam = load_config(os.path.join(out, "best", "config.yaml"), ["Model.beam_size=2"])
    beam = evaluate_checkpoint(cfg_beam, os.path.join(out, "best"), "dev")
    assert beam["num_examples"] == len(dev) and 0.0 <= beam["seq_acc"] <= 1.0


def test_seq2seq_report_compares_decoded_text():
    from test_vocab import pair_counts
    from ppvarlen.data.vocab import TextEncoder

    enc = TextEncoder.build_seq2seq(*pair_counts(["中国", "人"], ["zhong guo", "ren"], "word"),
                                    "char", target_kind="word")
    ids = [enc.encode_target(t) for t in ("zhong guo", "ren")]
    data = [{"src_ids": [9], "tgt_ids": [enc.bos_id] + i + [enc.eos_id]} for i in ids]
    assert seq2seq_report(data, ids, enc) == {"seq_acc": 1.0, "ter": 0.0, "num_examples": 2}
    # one substituted syllable out of three reference syllables
    wrong = [[ids[0][0], ids[1][0]], ids[1]]
    assert seq2seq_report(data, wrong, enc) == {"seq_acc": 0.5, "ter": pytest.approx(1 / 3),
                                                "num_examples": 2}


def test_token_counts_include_both_sides():
    import numpy as np

    batch = Collator(0, fields=get_task("seq2seq").store_fields())(
        [{"src_ids": [7, 8, 9], "tgt_ids": [4, 10, 5]},
         {"src_ids": [7], "tgt_ids": [4, 10, 11, 12, 5]}])
    # real: sources 3 + 1, targets (BOS..last) 2 + 4; padded: 2x3 + 2x4
    assert get_task("seq2seq").token_counts(batch) == (10, 14)
    assert np.array_equal(batch["tgt_len"], [2, 4])


def test_seq2seq_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="right padding"):
        trainer_mod.Trainer(tiny_cfg(tmp_path, data={"padding_side": "left"}))
    with pytest.raises(ValueError, match="max_len_b"):
        trainer_mod.Trainer(tiny_cfg(tmp_path, model={"max_len_b": 0}))
