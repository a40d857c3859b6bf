"""What a run leaves behind besides checkpoints: train_log.jsonl, curves PNG, optional VisualDL.

Only rank 0 owns a Logbook.  On resume the log is cut back to the checkpoint's
step, so the file always describes one uninterrupted history.
"""
import json
import os

from ..config import ConfigError
from ..utils.io import atomic_binary_writer, atomic_write_text, disk_full_named


class Logbook:
    def __init__(self, output_dir, resume_step=None, visualdl=False):
        self.path = os.path.join(output_dir, "train_log.jsonl")
        if resume_step is None:
            atomic_write_text(self.path, "")
        else:
            self._truncate(resume_step)
        self.vdl = None
        if visualdl:
            try:
                from visualdl import LogWriter
            except ImportError:
                raise ConfigError("Train.visualdl: true needs the visualdl package, which is not "
                                  "installed; install it or set -o Train.visualdl=false") from None
            self.vdl = LogWriter(logdir=os.path.join(output_dir, "visualdl"))

    def _truncate(self, step):
        kept = [line for line in self.records() if line["step"] <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def records(self):
        if not os.path.isfile(self.path):
            return []
        with open(self.path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def write(self, record):
        line = json.dumps(record) + "\n"
        with disk_full_named(self.path, len(line), "appending to the training log"), \
                open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
        if self.vdl:
            for key, value in flatten(record).items():
                if key != "step" and isinstance(value, (int, float)):
                    self.vdl.add_scalar(tag=key, value=value, step=record["step"])

    def plot(self, png_path, metric):
        """Training loss and dev ``metric`` against step, one PNG."""
        from matplotlib.figure import Figure  # no pyplot: the process's backend stays as it was

        recs = self.records()
        train = [r for r in recs if "loss" in r]
        dev = [r for r in recs if "dev" in r]
        fig = Figure(figsize=(7, 4))
        ax = fig.subplots()
        ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss", lw=1)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        if dev:
            ax2 = ax.twinx()
            ax2.plot([r["step"] for r in dev], [r["dev"][metric] for r in dev], "o-", color="C1",
                     label=f"dev {metric}")
            ax2.set_ylabel(f"dev {metric}")
            ax2.legend(loc="lower right")
        ax.legend(loc="upper right")
        fig.tight_layout()
        with atomic_binary_writer(png_path) as f:
            fig.savefig(f, format="png", dpi=100)

    def close(self):
        if self.vdl:
            self.vdl.close()


def flatten(d, sep="/", prefix=""):
    """A nested dict as {"a<sep>b": value} (the metric logs' "/" and the config keys' ".")."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, sep, f"{prefix}{k}{sep}"))
        else:
            out[f"{prefix}{k}"] = v
    return out
