"""Train -> export -> infer.py, end to end: deploy predictions equal the dygraph model's.

A small sentiment Transformer and a small NER BiGRU-CRF are trained for a few steps on
the real corpora (``Data.limit`` examples per split), exported with the exporter, and
``deploy/python/infer.py`` (both backends) is run on the raw test texts.  The dygraph
reference is the engine's own evaluation path (dataset encoding, collator, windows
aggregated per document), so two independent code paths must agree:
classification argmax 100%, NER tags identical.

PPVARLEN_E2E_LIMIT=N sets Data.limit (default 120); 0 = the full splits (slow: for the
numbers in the report, not for CI).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT = int(os.environ.get("PPVARLEN_E2E_LIMIT", "120"))
RUNS = {  # name -> (config, overrides); few steps: the NER model must not collapse to all-O
    "sentiment": ("configs/sentiment/transformer.yaml",
                  ["Model.hidden_size=32", "Model.num_layers=1", "Model.num_heads=2",
                   "Model.ffn_size=64", "Data.max_tokens=2048", "Data.min_freq=1",
                   "Train.max_steps=12"]),
    "ner": ("configs/ner/bigru_crf.yaml",
            ["Model.emb_size=32", "Model.hidden_size=32", "Data.max_tokens=2048",
             "Data.max_len=64", "Data.stride=16",  # short windows: many test docs are windowed
             "Train.max_steps=2"]),
}


def _train_and_export(name, tmp):
    from ppvarlen.config import load_config
    from ppvarlen.engine import train
    from ppvarlen.export.exporter import export_checkpoint

    config, overrides = RUNS[name]
    out = os.path.join(tmp, name)
    cfg = load_config(os.path.join(REPO, config), overrides + [
        f"Global.output_dir={out}", "Train.progress_bar=false",
        f"Data.limit={LIMIT or 'null'}", "Train.log_every=1000"])
    train(cfg)
    export_dir = os.path.join(out, "export")
    export_checkpoint(os.path.join(out, "best"), export_dir, verify=False)
    return cfg, os.path.join(out, "best"), export_dir


@pytest.fixture(scope="module", params=["sentiment", "ner"])
def trained(request, tmp_path_factory):
    return request.param, *_train_and_export(request.param, str(tmp_path_factory.mktemp("e2e")))


def dygraph_reference(cfg, ckpt_dir):
    """Per test document: (text, predicted label id | tag ids) from the engine's eval path."""
    from ppvarlen.data.collate import Collator
    from ppvarlen.data.sources import load_corpus
    from ppvarlen.store_build import build_datasets
    from ppvarlen.data.longtext import aggregate_classification, aggregate_tokens
    from ppvarlen.engine.checkpoint import load_for_inference
    from ppvarlen.engine.evaluate import predict

    model, meta, encoder, _ = load_for_inference(ckpt_dir)
    test = build_datasets(cfg.Data, encoder=encoder).test
    outs = predict(model, test, meta["task"], Collator(encoder.pad_id, fields=test.store.fields),
                   cfg.Data.eval_max_tokens)
    doc_ids = [test[i]["doc_id"] for i in range(len(test))]
    examples = load_corpus(cfg.Data).splits["test"]
    if meta["task"] == "classification":
        docs, logits = aggregate_classification(doc_ids, np.stack(outs))
        texts = [examples[int(d)]["text"] for d in docs]
        return texts, [int(x) for x in logits.argmax(-1)]
    rows, offsets = [], []
    for i, tags in enumerate(outs):
        labels = np.asarray(test[i]["labels"])
        rows.append(np.asarray(tags)[labels != -100])
        offsets.append(test[i].get("offset", 0))
    docs, tag_docs = aggregate_tokens(doc_ids, offsets, rows)
    texts = ["".join(examples[int(d)]["tokens"]) for d in docs]
    return texts, [[meta["label_names"][int(t)] for t in doc] for doc in tag_docs]


@pytest.mark.parametrize("backend", ["paddle", "onnx"])
def test_infer_equals_dygraph_on_test_split(trained, backend, tmp_path):
    name, cfg, ckpt_dir, export_dir = trained
    texts, want = dygraph_reference(cfg, ckpt_dir)
    src = tmp_path / "test.txt"
    src.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    out = tmp_path / "pred.jsonl"
    r = subprocess.run([sys.executable, os.path.join(REPO, "deploy/python/infer.py"),
                        "--model-dir", export_dir, "--backend", backend, "--input", str(src),
                        "--output", str(out), "--no-progress"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    got = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert len(got) == len(texts)
    if name == "sentiment":
        same = np.mean([g["label_id"] == w for g, w in zip(got, want)])
        assert same == 1.0, f"argmax agreement {same:.4f}"
        assert len(set(want)) == 2  # both classes predicted: the comparison is not trivial
    else:
        assert len({t for w in want for t in w}) > 2  # varied tags, not a collapsed all-O model
        bad = [i for i, (g, w) in enumerate(zip(got, want)) if g["tags"] != w]
        assert not bad, f"{len(bad)} of {len(texts)} documents differ, first: {texts[bad[0]]}"
        for text, g in zip(texts, got):
            assert all(text[e["start"]:e["end"]] == e["text"] for e in g["entities"])
    summary = json.loads(r.stderr.strip().splitlines()[-1])
    print(f"\n{name}/{backend}: {len(texts)} texts, {summary}")
