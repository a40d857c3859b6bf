"""The small random-init run the task tests (text pairs, extractive QA) train and export."""
import json
import os

from ppvarlen.config import load_config


def tiny_model(name):
    return {"name": name, "hidden_size": 16, "num_layers": 1, "num_heads": 2, "ffn_size": 32,
            "dropout": 0.1, "max_position": 64, "type_vocab_size": 2}


def tiny_task_cfg(out, paths, data, model, log_every=1):
    """A 6-step run on ``paths`` (train/dev/test files) with ``data`` Data keys, ``model``."""
    return load_config(data={
        "Global": {"output_dir": str(out), "seed": 3},
        "Data": {"corpus": "jsonl", "train_file": paths["train"], "dev_file": paths["dev"],
                 "test_file": paths["test"], **data},
        "Model": model,
        "Optimizer": {"lr": 3e-3, "warmup_steps": 2},
        "Train": {"max_steps": 6, "log_every": log_every, "eval_every": 6, "keep_last": 1,
                  "progress_bar": False},
        # precision is not what these tests are about: fp32 only, not the host's auto set
        "Export": {"format": ["paddle", "onnx"], "precision": ["fp32"]},
    })


def assert_exact_parity(export_dir):
    """The export's ``--verify`` report: passed, and both backends (Paddle Inference with
    oneDNN, ONNX Runtime) within 1e-4 of eager with full agreement on the grid and the test set."""
    with open(os.path.join(export_dir, "parity.json")) as f:
        report = json.load(f)
    assert report["passed"], report["failures"]
    for part in ("grid", "test"):
        for name in ("paddle_inference_onednn", "onnx"):
            r = report["results"][part][name]
            assert r["max_abs_diff"] <= 1e-4 and r["agreement"] == 1.0, (part, name, r)
