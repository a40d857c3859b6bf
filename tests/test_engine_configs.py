"""Every shipped training config runs (2 steps on tiny data) with the public override keys,
and opens with the command that runs it."""
import glob
import json
import os

import pytest

from ppvarlen.config import load_config
from ppvarlen.engine import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ["configs/sentiment/transformer.yaml", "configs/sentiment/bilstm.yaml",
           "configs/sentiment/ernie_tiny.yaml", "configs/sentiment/transformer_ngram.yaml",
           "configs/ner/bigru_crf.yaml", "configs/g2p/transformer.yaml",
           "configs/sentiment/wide_deep.yaml"]
# Configs tested in their own file with lighter data (tests/test_pretrain.py: without the
# People's Daily text it adds, which Data.limit does not cut).
OTHER_TOOL_CONFIGS = ["configs/sentiment/pretrain_mlm.yaml"]


@pytest.mark.parametrize("path", CONFIGS)
def test_config_runs_with_public_keys(path, tmp_path):
    first = open(os.path.join(REPO, path), encoding="utf-8").readline()
    assert first.startswith("# python tools/train.py -c " + path), first
    cfg = load_config(os.path.join(REPO, path), [
        f"Global.output_dir={tmp_path}", "Global.seed=3", "Data.max_len=48", "Train.epochs=1",
        "Train.max_steps=2", "Data.limit=24", "Train.progress_bar=false"])
    result = train(cfg)
    assert result["steps"] == 2
    metrics = json.load(open(tmp_path / "metrics.json"))
    assert metrics["test"]["num_examples"] == 24


def test_all_engine_configs_are_listed():
    shipped = {os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "configs", "*", "*.yaml"))}
    assert shipped <= set(CONFIGS) | set(OTHER_TOOL_CONFIGS), shipped - set(CONFIGS) - set(OTHER_TOOL_CONFIGS)
