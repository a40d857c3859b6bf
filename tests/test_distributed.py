"""Two CPU processes under paddle.distributed.launch (gloo): same weights, rank 0 alone writes."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
from safetensors.numpy import load_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DRIVER = textwrap.dedent('''
    import json, os, sys
    from ppvarlen.config import load_config
    from ppvarlen.engine import checkpoint, trainer
    from ppvarlen.models.weights import save_weights

    out, probe = sys.argv[1], sys.argv[2]
    rank = os.environ["PADDLE_TRAINER_ID"]
    real_save = checkpoint.save_checkpoint

    def recording_save(path, *args, **kw):  # who writes checkpoints?
        with open(os.path.join(probe, f"saves.rank{rank}"), "a") as f:
            f.write(path + "\\n")
        return real_save(path, *args, **kw)

    checkpoint.save_checkpoint = recording_save
    cfg = load_config(data={
        "Global": {"output_dir": out, "seed": 5},
        "Data": {"corpus": "sentiment", "limit": 64, "max_len": 48, "max_tokens": 384},
        "Model": {"name": "transformer_cls", "hidden_size": 16, "num_layers": 1, "num_heads": 2,
                  "ffn_size": 32, "max_position": 48},
        "Train": {"max_steps": 4, "log_every": 1, "eval_every": 2, "progress_bar": False}})
    t = trainer.Trainer(cfg)
    result = t.fit()
    save_weights(t.model, os.path.join(probe, f"final.rank{rank}.safetensors"))
    t.sampler.set_epoch(0)
    with open(os.path.join(probe, f"batches.rank{rank}.json"), "w") as f:
        json.dump(t.sampler.epoch_batches(), f)
''')


def test_two_process_data_parallel(tmp_path):
    out, probe = tmp_path / "run", tmp_path / "probe"
    probe.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                        "--log_dir", str(tmp_path / "logs"), str(driver), str(out), str(probe)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    logs = "".join(open(tmp_path / "logs" / f).read()[-3000:] for f in sorted(os.listdir(tmp_path / "logs")))
    assert r.returncode == 0, logs
    a = load_file(probe / "final.rank0.safetensors")
    b = load_file(probe / "final.rank1.safetensors")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert (probe / "saves.rank0").exists() and not (probe / "saves.rank1").exists()
    assert (out / "best" / "model.safetensors").exists()
    shards = [json.load(open(probe / f"batches.rank{r}.json")) for r in (0, 1)]
    assert len(shards[0]) == len(shards[1]) and shards[0] != shards[1]  # each rank its own shard
    assert {i for b in shards[0] + shards[1] for i in b} == set(range(64))
    with open(out / "train_log.jsonl") as f:
        steps = [json.loads(line)["step"] for line in f if '"loss"' in line]
    assert steps == [1, 2, 3, 4]  # one writer: no duplicated records
    metrics = json.load(open(out / "metrics.json"))
    assert metrics["world_size"] == 2 and metrics["test"]["num_examples"] == 64
