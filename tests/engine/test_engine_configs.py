"""Every shipped training config runs (2 steps on tiny data) with the public override keys,
and opens with the command that runs it."""
import glob
import json
import os

import pytest
import yaml

from ppvarlen.config import ConfigError, load_config
from ppvarlen.config_schema import MODEL_KEYS, SCHEMA
from ppvarlen.engine import train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = ["configs/sentiment/transformer.yaml", "configs/sentiment/bilstm.yaml",
           "configs/sentiment/ernie_tiny.yaml", "configs/sentiment/transformer_ngram.yaml",
           "configs/ner/bigru_crf.yaml", "configs/g2p/transformer.yaml",
           "configs/sentiment/wide_deep.yaml"]
# Configs tested in their own file with lighter data (tests/models/test_pretrain.py: without the
# People's Daily text it adds, which Data.limit does not cut).
OTHER_TOOL_CONFIGS = ["configs/sentiment/pretrain_mlm.yaml",
                      # need a PaddleNLP directory: tests/models/test_paddlenlp_models.py makes one
                      "configs/sentiment/paddlenlp.yaml", "configs/ner/paddlenlp.yaml",
                      # a derived pair corpus first: tests/tasks/test_text_pair.py trains on one
                      "configs/pairs/transformer.yaml",
                      # a derived QA corpus first: tests/tasks/test_extractive_qa.py runs it on one
                      "configs/qa/transformer.yaml",
                      # a derived pair corpus first: tests/tasks/test_embedding.py runs it on one
                      "configs/embedding/transformer.yaml"]


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


@pytest.mark.parametrize("path", CONFIGS + OTHER_TOOL_CONFIGS)
def test_shipped_config_builds_its_model_from_its_own_keys(path):
    """Loading rejects any Model key the model does not read; building shows it reads them."""
    from ppvarlen.model_registry import MODELS
    from ppvarlen.models import build_model

    cfg = load_config(os.path.join(REPO, path))
    name = cfg.Model.name
    assert set(cfg.Model.to_dict()) == {"name", *MODEL_KEYS[name]}
    task = MODELS[name].tasks[0]
    if name.startswith("paddlenlp_") and cfg.Model.pretrained_dir is None:
        # a PaddleNLP directory model: the config names none (it is given with -o); building
        # without one must say so, never fetch anything (tests/models/test_paddlenlp_models.py builds
        # them from real save_pretrained directories)
        with pytest.raises(ConfigError, match="not a local directory"):
            build_model(cfg.Model, 64, 3, 0, task)
        return
    model = build_model(cfg.Model, 64, 0 if task == "seq2seq" else 3, 0, task)
    assert sum(p.size for p in model.parameters()) > 0


def test_configs_of_another_model_than_their_base_do_not_inherit_its_model_keys():
    # bilstm.yaml and ernie_tiny.yaml take Data/Optimizer/Train from transformer.yaml, not Model
    base = load_config(os.path.join(REPO, "configs/sentiment/transformer.yaml"))
    for path in ("configs/sentiment/bilstm.yaml", "configs/sentiment/ernie_tiny.yaml"):
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            own = yaml.safe_load(f)["Model"]
        cfg = load_config(os.path.join(REPO, path))
        assert cfg.Data.to_dict() == base.Data.to_dict()
        given = {k: v for k, v in cfg.Model.to_dict().items() if k in own}
        assert given == own
        # every other key is the schema default, not transformer.yaml's value
        assert all(v == SCHEMA["Model"][k].default
                   for k, v in cfg.Model.to_dict().items() if k not in own), path
