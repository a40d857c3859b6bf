"""``Train.to_static``: a model's forward + loss as ONE static program for every batch shape.

``paddle.jit.to_static(..., full_graph=True)`` with ``None`` for every batch and length dim,
the same dynamic-dim conversion export uses, so the program is traced once per run and then
serves every (batch, length) the token-budget sampler produces.  Backward runs through the
program's own grad program; the optimizer step stays eager (Paddle 3.3.1's AST conversion
has no ``Tensor.backward`` nor ``optimizer.minimize`` over a layer's parameters inside a
program: see benchmarks/train_throughput.py, whose whole_step variant builds the model in
static mode instead and measured no faster than this on g2p).

The loss is any ``batch_loss(model, batch) -> float32 scalar`` that reads numpy fields of a
collated batch.  Which fields it reads is recorded on a probe batch, so the caller does not
list them; they become the program's inputs, in that order.

Dropout: the program's dropout ops draw from the global generator, so the trainer's per-step
``paddle.seed`` makes static steps reproducible (exact resume) just as eager ones.
"""
import contextlib
import re

import paddle
from paddle.static import InputSpec

from ..config import ConfigError
from ..models import masks

# masked_cross_entropy is plain tensor code (no Python branch on a tensor), so it needs no
# AST rewrite, and Paddle 3.3.1's rewrite cannot compile its module-constant default
# (NameError: IGNORE_INDEX); run it as it is inside the program.
paddle.jit.marker.unified(masks.masked_cross_entropy, for_sot=False)


class _ReadRecorder(dict):
    """A batch dict that remembers which fields were read, in order."""

    def __init__(self, batch):
        super().__init__(batch)
        self.read = []

    def __getitem__(self, key):
        if key not in self.read:
            self.read.append(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        return self[key] if key in self else default


def fields_read(batch_loss, model, batch):
    """[(name, dtype, ndim)] of the batch fields ``batch_loss`` reads (one eager no-grad call)."""
    recorder = _ReadRecorder(batch)
    with paddle.no_grad():
        batch_loss(model, recorder)
    return [(k, str(batch[k].dtype), batch[k].ndim) for k in recorder.read]


class StaticLoss(paddle.nn.Layer):
    """``StaticLoss(model, batch_loss, fields)([tensors]) -> loss``, converted once.

    A wrapper layer, so ``model.forward`` itself stays eager for evaluation and export.
    Call ``inputs(batch)`` for the tensor list; wrap it in ``paddle.DataParallel`` (not the
    model) for multi-process runs, so one reducer sees the program's gradients.
    """

    def __init__(self, model, batch_loss, fields, executor="serial"):
        super().__init__()
        self.executor = executor
        self.model = model
        self.batch_loss = batch_loss
        self.names = [name for name, _, _ in fields]
        spec = [[InputSpec([None] * ndim, dtype, name) for name, dtype, ndim in fields]]
        paddle.jit.to_static(self, input_spec=spec, full_graph=True)

    def forward(self, tensors):
        return self.batch_loss(self.model, dict(zip(self.names, tensors)))

    def running(self):
        """Context for the forward AND backward of every step (Paddle's executor flags)."""
        return executor_flags(self.executor)

    def inputs(self, batch):
        return [[paddle.to_tensor(batch[name]) for name in self.names]]

    def traced_count(self):
        """How many programs were built; 1 for the whole run is the contract."""
        return self.forward.get_traced_count()

    def check_traced_once(self):
        n = self.traced_count()
        if n != 1:
            raise RuntimeError(f"Train.to_static: the loss program was traced {n} times; it must "
                               f"be traced once for all batch shapes (fields {self.names}: did a "
                               f"field's dtype or rank change, or the train/eval mode?)")


# Paddle's executor flags for the step programs.  Paddle reads them when a program's interpreter
# is built (its first run) AND at each run, and a program built with serial_run fails when run
# without it ("Workqueue of index 0 is not initialized"), so they are set around every use of
# the programs (``StaticLoss.running``) and put back after: other programs of the process (an
# export after training, another trainer) see their own.
# * use_inplace: reuse buffers in place (CPU default: off);
# * serial_run (Train.static_executor): ops on one thread, in order ("serial"), or spread over
#   Paddle's thread pool ("threaded", its default).  On the 2-core host the pool cost the
#   chain-shaped classifiers more than it overlapped; with one math thread it paid off for the
#   encoder-decoder, but serial ops with MKL on both cores (Train.cpu_threads, engine/
#   cpu_settings.py) beat it on every shipped config (benchmarks/train_throughput.py --what static).
EXECUTOR_FLAGS = {
    "serial": {"FLAGS_new_executor_use_inplace": True, "FLAGS_new_executor_serial_run": True},
    "threaded": {"FLAGS_new_executor_use_inplace": True, "FLAGS_new_executor_serial_run": False},
}


@contextlib.contextmanager
def executor_flags(executor):
    flags = EXECUTOR_FLAGS[executor]
    previous = paddle.get_flags(list(flags))
    paddle.set_flags(flags)
    try:
        yield
    finally:
        paddle.set_flags(previous)


def compile_loss(model, batch_loss, probe_batch, model_name, autocast=None, executor="serial"):
    """Convert ``batch_loss`` for ``model`` and run one forward + backward on ``probe_batch``.

    Any failure (conversion, the static forward, its backward) is a ConfigError naming the
    model and Paddle's reason: a model that cannot be converted fails here, at start, never
    falls back to eager.  Gradients of the probe are cleared.  ``autocast`` is a context
    manager factory (AMP) the steps will also run under, so the probe traces what they run.
    ``executor`` is Train.static_executor (EXECUTOR_FLAGS).
    """
    model.train()
    fields = fields_read(batch_loss, model, probe_batch)
    try:
        static = StaticLoss(model, batch_loss, fields, executor)
        static.train()
        with static.running():
            if autocast is not None:
                with autocast():
                    loss = static(*static.inputs(probe_batch))
            else:
                loss = static(*static.inputs(probe_batch))
            if loss.size != 1 or loss.dtype != paddle.float32:
                raise TypeError(f"the loss must be a float32 scalar, got {loss.dtype} {loss.shape}")
            loss.backward()
    except Exception as e:  # noqa: BLE001 -- every reason becomes the one start-up error
        raise ConfigError(f"Train.to_static: Model.name={model_name} cannot run as one static "
                          f"program ({_first_lines(e)}); set "
                          f"Train.to_static: false to train it eagerly") from e
    finally:
        for p in model.parameters():
            p.clear_gradient(False)
    static.check_traced_once()
    return static


def _first_lines(error, limit=600):
    """Paddle's conversion errors span pages: keep the error line and the user code it hit."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    reason = next((ln for ln in lines if re.match(r"^\w+(Error|Exception): ", ln)), None)
    reason = reason or f"{type(error).__name__}: {lines[-1] if lines else error!r}"
    user_frames = [ln for ln in lines if ln.startswith("File ") and "site-packages" not in ln]
    text = reason + (f" at {user_frames[-1]}" if user_frames else "")
    return text if len(text) <= limit else text[:limit] + " ..."
