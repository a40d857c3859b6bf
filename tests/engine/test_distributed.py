"""Two CPU processes under paddle.distributed.launch (gloo): same weights, rank 0 alone writes."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
from safetensors.numpy import load_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DRIVER = textwrap.dedent('''
    import json, os, sys
    from ppvarlen.config import load_config
    from ppvarlen.engine import checkpoint, trainer
    from ppvarlen.models.weights import save_weights

    out, probe, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    rank = os.environ["PADDLE_TRAINER_ID"]
    real_save = checkpoint.save_checkpoint
    if mode == "interrupt":  # rank 0 alone gets "Ctrl-C" after step 2: both ranks must stop there
        real_step = trainer.Trainer.train_step

        def step_then_interrupt(self, batch):
            loss = real_step(self, batch)
            if rank == "0" and self.state["step"] == 1:  # step 2 is running
                self._stop_flag["stop"] = True
            return loss

        real_install = trainer._install_stop_flag

        def keep_flag():
            flag, previous = real_install()
            trainer.Trainer._stop_flag = flag
            return flag, previous

        trainer._install_stop_flag = keep_flag
        trainer.Trainer.train_step = step_then_interrupt

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
        "Train": {"max_steps": 4, "log_every": 1, "eval_every": 2, "progress_bar": False,
                  "resume": "auto" if mode == "resume" else None}})
    t = trainer.Trainer(cfg)
    result = t.fit()
    if mode == "interrupt":
        assert result == {"interrupted": True, "step": 2}, result
        sys.exit(0)
    save_weights(t.model, os.path.join(probe, f"final.rank{rank}.safetensors"))
    t.sampler.set_epoch(0)
    with open(os.path.join(probe, f"batches.rank{rank}.json"), "w") as f:
        json.dump(t.sampler.epoch_batches(), f)
''')


def launch(tmp_path, out, probe, mode, tag):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    logs = tmp_path / f"logs_{tag}"
    r = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                        "--log_dir", str(logs), str(driver), str(out), str(probe), mode],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    text = "".join(open(logs / f).read()[-3000:] for f in sorted(os.listdir(logs)))
    assert r.returncode == 0, text


def losses(out):
    with open(out / "train_log.jsonl") as f:
        return [(r["step"], r["loss"]) for r in map(json.loads, f) if "loss" in r]


def test_two_process_data_parallel_and_resume(tmp_path):
    out, probe = tmp_path / "run", tmp_path / "probe"
    probe.mkdir()
    launch(tmp_path, out, probe, "full", "full")
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
    # interrupted on rank 0 after step 2 (both ranks stop, rank 0 saves), then resumed with
    # the same launcher: steps 3-4 repeat the uninterrupted run's losses and weights exactly
    out2, probe2 = tmp_path / "run2", tmp_path / "probe2"
    probe2.mkdir()
    launch(tmp_path, out2, probe2, "interrupt", "interrupt")
    assert os.path.realpath(out2 / "last").endswith("ckpt-2")
    launch(tmp_path, out2, probe2, "resume", "resume")
    assert losses(out2) == losses(out)
    a, b = load_file(probe / "final.rank0.safetensors"), load_file(probe2 / "final.rank1.safetensors")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
