"""Row runners (``ppvarlen.runtime.row_checks``) over the runtimes a model is deployed with.

``onnx_batch`` (ONNX Runtime, CPU), ``paddle_batch`` (Paddle Inference, CPU) and
``dygraph_batch`` (a PaddleNLP model called the way its tokenizer's output is passed to it)
each run a batch of id rows; ``RowRunner`` around them pads (``feeding.Feeder``), splits the
batch into the graph's fixed batch size when it has one, and cuts per-token outputs to each
row's length.  ``ExportRows`` runs a ppvarlen export through its serving ``Predictor``.
Which outputs are per token is measured, not guessed from names: an output whose second axis
follows the padded width across two widths (``per_token_outputs``).
"""
import inspect

import numpy as np
import paddle

from ppvarlen.runtime.admission import PredictorRows
from ppvarlen.runtime.row_checks import ModelRaised, first_line, split_rows


def per_token_outputs(shapes_at, widths):
    """Names of the outputs whose second axis is the padded width at every width in
    ``widths`` (``shapes_at(width)`` -> {output name: shape} of one row run at that width)."""
    shapes = [shapes_at(w) for w in widths]
    return {n for n, shape in shapes[0].items()
            if all(len(s.get(n, ())) >= 2 and s[n][1] == w for s, w in zip(shapes, widths))}


class RowRunner:
    """``run(id_rows, width=None)`` -> one {output: array} per row, over ``batch_fn(feeds) ->
    {output: array}``."""

    def __init__(self, feeder, batch_fn, fixed_batch=None):
        self.feeder, self.batch_fn, self.fixed_batch = feeder, batch_fn, fixed_batch
        self.per_token = set()

    def _batch(self, rows, width=None):
        width = self.feeder.width(rows, width)
        size = self.fixed_batch or len(rows)
        outputs = {}
        for start in range(0, len(rows), size):
            chunk = rows[start:start + size]
            filled = chunk + [chunk[0]] * (size - len(chunk))  # a fixed batch is filled, then cut
            feeds, _ = self.feeder.arrays(filled, width)
            try:
                got = self.batch_fn(feeds)
            except Exception as e:  # noqa: BLE001 - whatever the runtime raises is evidence
                raise ModelRaised(f"{type(e).__name__}: {first_line(e)}") from None
            for name, value in got.items():
                outputs.setdefault(name, []).append(np.asarray(value)[:len(chunk)])
        return {name: np.concatenate(parts) if len({p.shape[1:] for p in parts}) == 1
                else [row for p in parts for row in p] for name, parts in outputs.items()}

    def run(self, id_rows, width=None):
        seq_len = np.array([len(r) for r in id_rows], dtype=np.int64)
        return split_rows(self._batch(id_rows, width), seq_len, self.per_token)

    __call__ = run

    def find_per_token(self, row):
        """Measure which outputs have one entry per position (``row``: a short id row)."""
        fixed = self.feeder.fixed_length
        widths = [fixed] if fixed else [len(row) + 2, len(row) + 5]
        self.per_token = per_token_outputs(
            lambda w: {n: np.shape(v) for n, v in self._batch([row], w).items()}, widths)
        return self.per_token


class ExportRows(PredictorRows):
    """A ppvarlen export through its serving ``Predictor``, as a row runner.

    Besides the manifest's ``per: token`` outputs, every output measured to follow the padded
    width is cut to each row's length (decoded tags [B, L] are per token whether or not the
    manifest says so: compared uncut, a row padded further has a longer tag row).  Where the
    serving path decodes tags outside the graph (ONNX: Viterbi in numpy over the emissions),
    those tags are an output too, named ``tags``: they are what a user reads."""

    def __init__(self, predictor):
        super().__init__(predictor, answers=predictor.task.generates)
        self.decodes_outside = getattr(predictor, "crf_matrix", None) is not None

    def run(self, id_rows, width=None):
        rows = super().run(id_rows, width)
        if self.answers or not self.decodes_outside:
            return rows
        try:
            decoded = self.predictor.task.engine_rows(self.predictor, *self.last)
        except Exception as e:  # noqa: BLE001 - the decoder's own words name the broken part
            raise ModelRaised(f"{type(e).__name__}: {first_line(e)}") from None
        for row, tags in zip(rows, decoded):
            row["tags"] = np.asarray(tags)
        return rows

    __call__ = run

    def find_per_token(self, row):
        if self.answers:  # a task's answer rows are already one per row, cut by the task
            return self.per_token

        def shapes_at(width):
            super(ExportRows, self).run([row], width)
            return {n: np.shape(v) for n, v in self.last[0].items()
                    if isinstance(v, np.ndarray)}
        limit = self.predictor.max_position
        widths = [w for w in (len(row) + 1, len(row) + 2, len(row) + 5)
                  if not limit or w <= int(limit)][-2:]
        if len(widths) == 2:  # else the manifest's per-token outputs are all there is to go by
            self.per_token |= per_token_outputs(shapes_at, widths)
        return self.per_token


def onnx_batch(session):
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(None, feeds)))


def paddle_batch(predictor):
    def run(feeds):
        for name in predictor.get_input_names():
            predictor.get_input_handle(name).copy_from_cpu(feeds[name])
        predictor.run()
        return {n: predictor.get_output_handle(n).copy_to_cpu()
                for n in predictor.get_output_names()}
    return run


def dygraph_batch(net):
    """A PaddleNLP model called with the tokenizer's keys; outputs named ``logits`` (one) or
    ``output_0``, ``output_1``, ... (a tuple)."""
    takes_return_dict = "return_dict" in inspect.signature(net.forward).parameters

    def run(feeds):
        kwargs = {k: paddle.to_tensor(v) for k, v in feeds.items()}
        if takes_return_dict:
            kwargs["return_dict"] = False
        with paddle.no_grad():
            out = net(**kwargs)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        arrays = [o.astype("float32").numpy() if o.dtype in (paddle.float16, paddle.bfloat16)
                  else o.numpy() for o in out if isinstance(o, paddle.Tensor)]
        return {"logits": arrays[0]} if len(arrays) == 1 else \
            {f"output_{i}": a for i, a in enumerate(arrays)}
    return run
