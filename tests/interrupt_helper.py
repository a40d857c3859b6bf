"""Ctrl-C in the middle of a training run, for the exact-resume tests."""
import os
import signal


def interrupt_during_step(monkeypatch, trainer_mod, step):
    """Patch the Trainer so the process gets SIGINT while it runs optimizer step ``step`` (as a
    user's Ctrl-C would); returns the original ``train_step`` to put back for the resumed run."""
    original = trainer_mod.Trainer.train_step

    def train_step(self, batch):
        loss = original(self, batch)
        if self.state["step"] == step - 1:
            os.kill(os.getpid(), signal.SIGINT)
        return loss

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", train_step)
    return original
