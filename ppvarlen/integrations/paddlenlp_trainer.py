"""ppvarlen's length-aware batching inside ``paddlenlp.trainer.Trainer`` (PaddleNLP 2.8.1).

    from ppvarlen.integrations.paddlenlp_trainer import LengthBatchingTrainer, ModelInputCollator
    trainer = LengthBatchingTrainer(model=model, args=training_args, train_dataset=train_ds,
                                    eval_dataset=dev_ds, data_collator=ModelInputCollator(tokenizer, model),
                                    compute_metrics=accuracy, max_tokens=4096)
    trainer.train()                 # or train(resume_from_checkpoint=...)
    trainer.predict(test_ds)        # predictions in test_ds order

What the stock Trainer lacks, and what this module does about it:

* No length grouping.  ``max_tokens`` alone gives ``TokenBudgetBatchSampler``
  (batches of size x longest <= max_tokens); with ``bucket_boundaries`` it is
  ``BucketBatchSampler``.  The training sampler is sharded with the Trainer's
  ``dataset_world_size`` / ``dataset_rank``, so under ``paddle.distributed.launch``
  every rank yields the same number of batches; seeded with ``args.seed``.
* ``set_epoch`` is only called on ``paddle.io.DistributedBatchSampler``: a
  callback sets our sampler's epoch at every epoch start, from
  ``global_step // steps_per_epoch`` -- the Trainer's own formula, so after
  ``resume_from_checkpoint`` the epoch (and its shuffle) is the one the
  interrupted run was in.  The Trainer then skips the batches already trained by
  iterating the loader (collation only, no forward), so the resumed run sees
  exactly the batches an uninterrupted run would.  No sampler state is stored:
  batches are a pure function of (seed, epoch).  Two PaddleNLP 2.8.1 resume gaps
  are closed: at an epoch boundary (nothing to skip) it never restored the RNG
  (dropout) state, and ``resume_from_checkpoint=True`` failed after loading the
  weights; both work here.
* Token-budget batches are packed within shuffled pools of ``pool_size``
  batches (sorted by length inside a pool), so every epoch groups different
  examples.  Sorting the whole split instead (``pool_size=0``) pads least but puts
  the same neighbours together every epoch, and a random-init model trained that
  way stayed at chance on the sentiment benchmark (docs/PADDLENLP.md).  The
  Trainer computes steps per epoch ONCE, so the sampler is given a fixed
  ``num_batches``: the largest natural count over the epochs the run will do
  (epochs with fewer have their largest batches halved); bucket counts are fixed
  by construction.
* ``evaluation_loop`` reads ``batch_sampler.batch_size`` (our samplers expose
  the largest batch) and concatenates outputs in batch order: evaluation and
  prediction run on length-sorted batches and ``predictions`` / ``label_ids``
  are put back in dataset order (``ppvarlen.data.order.restore_order``) before
  ``compute_metrics`` sees them.  With several processes every rank evaluates
  the whole set (no gather of unequal batch shapes); results are identical.
* ``model(**inputs)`` rejects unknown keys: ``ModelInputCollator`` emits only
  fields the model's ``forward`` takes.
* The model's loss is a mean over its batch, so with batches of 5 long or 64
  short examples every step would weigh a long text 13x a short one.  With
  ``loss_weighting="example"`` (the default) each training loss is scaled by the
  batch's labelled targets (examples, or non-ignored tokens for token
  classification) over their mean per batch, as ppvarlen's own trainer does:
  every target weighs the same, whatever batch it lands in.

* Resume reads two files PaddleNLP writes with ``paddle.save`` (pickle) even
  with ``unified_checkpoint=True``: ``rng_state*.pth`` and ``scheduler.pdparams``.
  They are read here by an unpickler that builds plain data only (numbers,
  strings, containers, numpy arrays, Paddle's RNG state) and refuses anything
  else, naming the file; resume requires ``unified_checkpoint=True`` so that the
  weights and optimizer state are safetensors.

Datasets: anything indexable with ``len`` whose items are dicts (a PaddleNLP
``MapDataset`` from ``load_dataset(read_fn, lazy=False)``, a list, ...), already
tokenised.  Lengths are computed once per dataset by ``lengths_of``.
"""
import functools
import inspect
import math
import os
import pickle
import types
from collections import Counter

import numpy as np
import paddle
import paddlenlp.transformers as paddlenlp_transformers
from paddle.io import DataLoader
from paddlenlp.trainer import Trainer, TrainerCallback
from paddlenlp.trainer.trainer_utils import EvalLoopOutput, EvalPrediction, get_last_checkpoint

from ..data.collate import IGNORE_INDEX, pad_sequences
from ..data.errors import DataError
from ..data.order import restore_order
from ..data.samplers import BucketBatchSampler, TokenBudgetBatchSampler
from ..utils.log import get_logger

log = get_logger("integrations.paddlenlp_trainer")
LENGTH_SAMPLERS = (TokenBudgetBatchSampler, BucketBatchSampler)

# fields padded per token; their pad value (None = the tokenizer's pad id)
_TOKEN_FIELD_PAD = {"input_ids": None, "token_type_ids": "type", "attention_mask": 0,
                    "position_ids": 0, "labels": IGNORE_INDEX}


# what paddle.save writes for the Trainer's RNG state and LR scheduler: numpy arrays
# (reconstruct, ndarray, dtype) and Paddle's generator state; builtins need no lookup
_PLAIN_DATA_GLOBALS = {("numpy._core.multiarray", "_reconstruct"),
                       ("numpy.core.multiarray", "_reconstruct"), ("numpy", "ndarray"),
                       ("numpy", "dtype"), ("paddle.base.libpaddle", "GeneratorState")}


class _PlainDataUnpickler(pickle.Unpickler):
    def __init__(self, file, path):
        super().__init__(file, encoding="latin1")
        self.path = path

    def find_class(self, module, name):
        if (module, name) not in _PLAIN_DATA_GLOBALS:
            raise pickle.UnpicklingError(
                f"{self.path}: refusing to unpickle {module}.{name}; ppvarlen reads only plain "
                f"data (numbers, strings, lists, dicts, numpy arrays, Paddle RNG state) from a "
                f"Trainer checkpoint. Was this checkpoint written by paddlenlp's Trainer?")
        return super().find_class(module, name)


def load_plain_data(path, **_configs):
    """``paddle.load`` for the Trainer's rng_state / scheduler files, without running code."""
    with open(path, "rb") as f:
        return _PlainDataUnpickler(f, path).load()


class _PlainDataPaddle:
    """``paddle`` as PaddleNLP's resume methods see it: ``load`` reads plain data only, every
    other name is Paddle's."""
    load = staticmethod(load_plain_data)

    def __getattr__(self, name):
        return getattr(paddle, name)


def _with_plain_data_load(method):
    """A copy of PaddleNLP's ``method`` (same code) whose global name ``paddle`` is a
    _PlainDataPaddle, so its ``paddle.load`` calls refuse pickled code.  Nothing is patched:
    ``paddle.load`` itself, PaddleNLP's module and other threads and Trainers are untouched."""
    scoped_globals = dict(method.__globals__, paddle=_PlainDataPaddle())
    copy = types.FunctionType(method.__code__, scoped_globals, method.__name__,
                              method.__defaults__, method.__closure__)
    copy.__kwdefaults__ = method.__kwdefaults__
    return functools.update_wrapper(copy, method)


def lengths_of(dataset, field="input_ids"):
    """Token count of every example of ``dataset``, as an int64 array (read once).

    ``example[field]`` is either the token list (its ``len`` is used) or an int
    length stored by the user (used as is).  Examples with no ``field`` or an
    empty one are a ``DataError`` naming the example.
    """
    lengths = np.empty(len(dataset), dtype=np.int64)
    for i in range(len(dataset)):
        example = dataset[i]
        if not isinstance(example, dict) or field not in example:
            have = sorted(example) if isinstance(example, dict) else type(example).__name__
            raise DataError(f"example #{i} has no field {field!r} (it has {have}); tokenise the "
                            f"dataset first or pass length_field=<the field holding the tokens>")
        value = example[field]
        n = int(value) if isinstance(value, (int, np.integer)) else len(value)
        if n < 1:
            raise DataError(f"example #{i}: field {field!r} is empty; drop empty examples "
                            f"before batching")
        lengths[i] = n
    return lengths


def forward_parameters(model):
    """Names of the keyword inputs ``model.forward`` takes (None: it takes ``**kwargs``)."""
    params = inspect.signature(model.forward).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


class ModelInputCollator:
    """Pads a list of tokenised examples into exactly the inputs ``model.forward`` takes.

    Per batch, to its longest example, on the right: ``input_ids`` with the
    tokenizer's pad id, ``token_type_ids`` with its pad token type, per-token
    ``labels`` with -100 (the loss's ignore index); a scalar ``label``/``labels``
    becomes ``labels`` [B].  ``attention_mask`` (1 = real token) is built from the
    lengths when the forward takes it and the examples do not carry one.  Example
    fields the forward does not take (text, ids, lengths...) are left out: they
    would make ``model(**inputs)`` fail.  Returns int64 numpy arrays (the
    DataLoader turns them into tensors).
    """

    def __init__(self, tokenizer, model):
        self.pad_id = tokenizer.pad_token_id
        if self.pad_id is None:
            raise ValueError("ModelInputCollator: the tokenizer has no pad token; set "
                             "tokenizer.pad_token before batching")
        self.pad_type_id = int(getattr(tokenizer, "pad_token_type_id", 0) or 0)
        self.accepted = forward_parameters(model)
        self._told = False  # fields left out are logged once

    def _takes(self, name):
        return self.accepted is None or name in self.accepted

    def __call__(self, items):
        if not items:
            raise ValueError("ModelInputCollator got an empty batch")
        rows = [dict(item) for item in items]
        for row in rows:
            if "label" in row:
                row["labels"] = row.pop("label")
        lens = []
        for i, row in enumerate(rows):
            if "input_ids" not in row:
                raise DataError(f"batch item {i} has no input_ids (fields {sorted(row)}); "
                                f"tokenise the dataset before training")
            if set(row) != set(rows[0]):
                raise DataError(f"batch item {i} has fields {sorted(row)} but item 0 has "
                                f"{sorted(rows[0])}; all items must have the same fields")
            lens.append(len(row["input_ids"]))
        left_out = sorted(k for k in rows[0] if not self._takes(k))
        if left_out and not self._told:
            log.info("ModelInputCollator: %s are not inputs of the model's forward; left out",
                     left_out)
            self._told = True
        width = max(lens)
        batch = {}
        for key in rows[0]:
            if not self._takes(key):
                continue
            values = [row[key] for row in rows]
            is_sequence = isinstance(values[0], (list, tuple, np.ndarray))
            if is_sequence and key not in _TOKEN_FIELD_PAD:
                raise DataError(f"ModelInputCollator: field {key!r} holds sequences but its pad "
                                f"value is unknown (padded fields: {sorted(_TOKEN_FIELD_PAD)}); "
                                f"drop it from the dataset or pad it yourself")
            if is_sequence:
                for i, (value, n) in enumerate(zip(values, lens)):
                    if len(value) != n:
                        raise DataError(f"batch item {i}: {key} has {len(value)} entries but "
                                        f"input_ids has {n}; they must align one-to-one")
                pad = {None: self.pad_id, "type": self.pad_type_id}.get(_TOKEN_FIELD_PAD[key],
                                                                       _TOKEN_FIELD_PAD[key])
                batch[key] = pad_sequences(values, pad, width)
            else:
                batch[key] = np.asarray(values, dtype=np.int64)
        if self._takes("attention_mask") and "attention_mask" not in batch:
            batch["attention_mask"] = pad_sequences([[1] * n for n in lens], 0, width)
        return batch


class _EpochStart(TrainerCallback):
    """Runs ``LengthBatchingTrainer._start_epoch`` when the Trainer begins an epoch."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.trainer._start_epoch(state, train_dataloader)


class LengthBatchingTrainer(Trainer):
    """``paddlenlp.trainer.Trainer`` with ppvarlen's length-aware batch samplers.

    Extra keyword arguments (the rest go to ``Trainer``):
      max_tokens        padded-token budget per batch (size x longest), train and eval
      bucket_boundaries train with ``BucketBatchSampler`` over these length buckets
                        instead of token budget: per-bucket size max_tokens // boundary,
                        or, with max_tokens=None, ``per_device_train_batch_size``
                        examples per batch in every bucket
      pool_size         token budget: examples are sorted by length within shuffled pools
                        of this many batches (default 16; 0 = the whole split)
      max_sentences     optional cap on examples per batch
      eval_max_tokens   budget for evaluate/predict (default: max_tokens, else
                        per_device_eval_batch_size x the dataset's longest example)
      length_field      example field giving the length (token list or int)
      loss_weighting    "example" (default): scale each training batch's mean loss by its
                        labelled targets / their mean per batch; "batch": every batch
                        weighs the same (the stock Trainer's behaviour)
    In token-budget mode ``per_device_train_batch_size`` is not used for batching
    (the Trainer only logs it).
    """

    def __init__(self, *args, max_tokens=None, bucket_boundaries=None, pool_size=16,
                 max_sentences=None,
                 eval_max_tokens=None, length_field="input_ids", loss_weighting="example",
                 **kwargs):
        super().__init__(*args, **kwargs)
        if loss_weighting not in ("example", "batch"):
            raise ValueError(f"LengthBatchingTrainer: loss_weighting must be 'example' or "
                             f"'batch', got {loss_weighting!r}")
        if self.args.distributed_dataloader:
            raise ValueError("LengthBatchingTrainer: distributed_dataloader is not supported "
                             "(each rank reads its own shard); unset it")
        if max_tokens is None and not bucket_boundaries:
            raise ValueError("LengthBatchingTrainer: give max_tokens (token-budget batches), "
                             "or bucket_boundaries (fixed-size batches per length bucket)")
        self.max_tokens = None if max_tokens is None else int(max_tokens)
        self.eval_max_tokens = eval_max_tokens or max_tokens
        self.bucket_boundaries = bucket_boundaries
        self.max_sentences = max_sentences
        self.pool_size = int(pool_size)
        self.length_field = length_field
        self.loss_weighting = loss_weighting
        self._targets_per_batch = None  # mean labelled targets per training batch
        self._lengths = {}  # id(dataset) -> (dataset, lengths): computed once per dataset
        self._train_sampler = None
        self._gather_off = False
        self._resume_from = None
        self.add_callback(_EpochStart(self))

    def train(self, resume_from_checkpoint=None, ignore_keys_for_eval=None):
        """``Trainer.train``; ``resume_from_checkpoint=True`` picks the last checkpoint of
        ``output_dir`` (PaddleNLP 2.8.1 resolves True for the weights only, then fails)."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"resume_from_checkpoint=True: no checkpoint-* directory in "
                                 f"{self.args.output_dir}; train from scratch or give a path")
        if resume_from_checkpoint and not self.args.unified_checkpoint:
            raise ValueError("LengthBatchingTrainer: resuming reads the checkpoint without "
                             "unpickling weights, which needs unified_checkpoint=True "
                             "(safetensors); set it in TrainingArguments for the run that "
                             "saves the checkpoint and for the resumed one")
        self._resume_from = resume_from_checkpoint or None
        try:
            return super().train(resume_from_checkpoint, ignore_keys_for_eval)
        finally:
            self._resume_from = None

    def _start_epoch(self, state, train_dataloader):
        """Set our sampler's epoch (the Trainer only does it for paddle's
        DistributedBatchSampler), from the Trainer's own resume formula
        ``epochs_trained = global_step // steps_per_epoch``."""
        sampler = getattr(train_dataloader, "batch_sampler", None)
        if not isinstance(sampler, LENGTH_SAMPLERS):
            return
        steps_per_epoch = max(len(train_dataloader) // self.args.gradient_accumulation_steps, 1)
        sampler.set_epoch(state.global_step // steps_per_epoch)
        if self._resume_from is not None and state.global_step % steps_per_epoch == 0:
            # Resuming exactly at an epoch boundary skips no batch, and PaddleNLP restores the
            # RNG (dropout) state only after skipping: restore it here, as mid-epoch resume does.
            self._load_rng_state(self._resume_from)
        self._resume_from = None

    # PaddleNLP's resume methods read the checkpoint with paddle.load (pickle): here they run
    # with a ``paddle`` of their own whose load reads plain data only (see _with_plain_data_load)
    _load_rng_state = _with_plain_data_load(Trainer._load_rng_state)
    _load_optimizer_and_scheduler = _with_plain_data_load(Trainer._load_optimizer_and_scheduler)

    def dataset_lengths(self, dataset):
        """``lengths_of(dataset, length_field)``, computed once per dataset object."""
        key = id(dataset)
        if key not in self._lengths or self._lengths[key][0] is not dataset:
            self._lengths[key] = (dataset, lengths_of(dataset, self.length_field))
        return self._lengths[key][1]

    # ------------------------------------------------------------ loss weighting
    def targets_per_batch(self):
        """Mean labelled targets (examples, or non-ignored label tokens) per training batch
        of an epoch: the whole split's targets over the global batch count, which is the
        same every epoch (read once)."""
        if self._targets_per_batch is None:
            sampler = self.train_batch_sampler()
            total = sum(_count_targets(self.train_dataset[i])
                        for i in range(len(self.train_dataset)))
            batches = len(sampler.epoch_batches()) * sampler.num_replicas
            self._targets_per_batch = total / batches
        return self._targets_per_batch

    def compute_loss(self, model, inputs, return_outputs=False):
        labels = inputs.get("labels")
        weight = None
        if self.loss_weighting == "example" and model.training and labels is not None:
            # counted before the forward: a criterion may pop labels from inputs
            weight = _count_targets({"labels": labels}) / self.targets_per_batch()
        result = super().compute_loss(model, inputs, return_outputs)
        if weight is None:
            return result
        if return_outputs:
            return result[0] * weight, result[1]
        return result * weight

    # ------------------------------------------------------------ samplers and loaders
    def train_batch_sampler(self):
        """This rank's training sampler (built once; the callback moves its epoch)."""
        if self._train_sampler is None:
            common = dict(shuffle=True, seed=self.args.seed, max_sentences=self.max_sentences,
                          num_replicas=self.args.dataset_world_size, rank=self.args.dataset_rank)
            lengths = self.dataset_lengths(self.train_dataset)
            if self.bucket_boundaries:
                size = {"max_tokens": self.max_tokens} if self.max_tokens else \
                    {"batch_size": self.args.per_device_train_batch_size}
                self._train_sampler = BucketBatchSampler(lengths, self.bucket_boundaries,
                                                         **size, **common)
            else:
                sampler = TokenBudgetBatchSampler(lengths, self.max_tokens,
                                                  pool_size=self.pool_size, **common)
                sampler.num_batches = max(sampler.batch_counts(range(self._planned_epochs(
                    sampler))))
                self._train_sampler = sampler
        return self._train_sampler

    def _planned_epochs(self, sampler):
        """Epochs this run can start (``num_train_epochs``, or enough for ``max_steps``): the
        fixed batch count must cover each of them."""
        if self.args.max_steps <= 0:
            return max(1, math.ceil(self.args.num_train_epochs))
        first = math.ceil(sampler.batch_counts([0])[0] / sampler.num_replicas)
        steps_per_epoch = max(first // self.args.gradient_accumulation_steps, 1)
        # the fixed count is >= epoch 0's, so epochs are no shorter than this estimate
        return math.ceil(self.args.max_steps / steps_per_epoch) + 1

    def eval_batch_sampler(self, dataset):
        """Deterministic length-sorted batches over the whole ``dataset`` (every rank)."""
        lengths = self.dataset_lengths(dataset)
        budget = self.eval_max_tokens or self.args.per_device_eval_batch_size * int(lengths.max())
        return TokenBudgetBatchSampler(lengths, int(budget), shuffle=False,
                                       max_sentences=self.max_sentences)

    def _loader(self, dataset, batch_sampler):
        return DataLoader(dataset, batch_sampler=batch_sampler, collate_fn=self.data_collator,
                          num_workers=self.args.dataloader_num_workers)

    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset")
        return self._loader(self.train_dataset, self.train_batch_sampler())

    def get_eval_dataloader(self, eval_dataset=None):
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset")
        return self._loader(dataset, self.eval_batch_sampler(dataset))

    def get_test_dataloader(self, test_dataset):
        return self._loader(test_dataset, self.eval_batch_sampler(test_dataset))

    # ------------------------------------------------------------ evaluation in input order
    def _nested_gather(self, tensors):
        # every rank evaluates the whole set (see evaluation_loop): nothing to gather
        return tensors if self._gather_off else super()._nested_gather(tensors)

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix="test"):
        """Like ``Trainer.predict``, predictions in ``test_dataset`` order.  PaddleNLP 2.8.1
        asks for the loss only when there is no ``compute_metrics`` (predictions come back
        None); prediction always returns them here."""
        self._predicting = True
        try:
            return super().predict(test_dataset, ignore_keys, metric_key_prefix)
        finally:
            self._predicting = False

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None,
                        ignore_keys=None, metric_key_prefix="eval", max_eval_iters=-1):
        if getattr(self, "_predicting", False):
            prediction_loss_only = False
        sampler = dataloader.batch_sampler
        if not isinstance(sampler, LENGTH_SAMPLERS):
            return super().evaluation_loop(dataloader, description, prediction_loss_only,
                                           ignore_keys, metric_key_prefix, max_eval_iters)
        if max_eval_iters is not None and max_eval_iters > 0:
            raise ValueError("max_evaluate_steps: evaluation batches are sorted by length, so "
                             "the first steps would hold only the shortest examples; evaluate "
                             "a smaller eval_dataset instead (unset max_evaluate_steps)")
        compute_metrics, self.compute_metrics = self.compute_metrics, None
        self._gather_off = True
        try:  # metrics are computed below, on outputs restored to the dataset order
            out = super().evaluation_loop(dataloader, description, prediction_loss_only,
                                          ignore_keys, metric_key_prefix, max_eval_iters)
        finally:
            self.compute_metrics = compute_metrics
            self._gather_off = False
        batches = sampler.epoch_batches()
        preds = _in_input_order(out.predictions, batches)
        labels = _in_input_order(out.label_ids, batches)
        metrics = dict(out.metrics)
        if compute_metrics is not None and preds is not None and labels is not None:
            for key, value in compute_metrics(EvalPrediction(predictions=preds,
                                                             label_ids=labels)).items():
                name = key if key.startswith(f"{metric_key_prefix}_") else \
                    f"{metric_key_prefix}_{key}"
                metrics[name] = value
        return EvalLoopOutput(predictions=preds, label_ids=labels, metrics=metrics,
                              num_samples=out.num_samples)


def _count_targets(example):
    """Labelled targets of an example or batch: its scalar labels, or its per-token labels
    that are not IGNORE_INDEX (padding, sub-word continuations)."""
    labels = example.get("labels", example.get("label"))
    if labels is None:
        raise DataError("loss_weighting='example' needs labels: the example has none (fields "
                        f"{sorted(example)}); label the data or pass loss_weighting='batch'")
    labels = np.asarray(labels.numpy() if hasattr(labels, "numpy") else labels)
    if labels.ndim == 0:
        return 1
    return int((labels != IGNORE_INDEX).sum())


def _in_input_order(outputs, batches):
    """Rows concatenated in batch order (array or tuple/list of arrays) -> dataset order."""
    if outputs is None:
        return None
    if isinstance(outputs, (tuple, list)):
        return type(outputs)(_in_input_order(o, batches) for o in outputs)
    sizes = np.cumsum([len(b) for b in batches])[:-1]
    rows = restore_order(batches, np.split(np.asarray(outputs), sizes))
    return np.stack(rows)


_ARCHS = {  # arch -> (config class, {task: model class}, tokenizer class), by name in paddlenlp
    "ernie": ("ErnieConfig", {"sequence": "ErnieForSequenceClassification",
                              "token": "ErnieForTokenClassification"}, "ErnieTokenizer"),
    "bert": ("BertConfig", {"sequence": "BertForSequenceClassification",
                            "token": "BertForTokenClassification"}, "BertTokenizer"),
}


def make_random_model_dir(out_dir, texts, num_labels, arch="ernie", task="sequence",
                          vocab_size=3000, hidden_size=64, num_layers=2, num_heads=2,
                          max_position=512, seed=0):
    """Write a small RANDOM-INIT PaddleNLP model and its tokenizer to ``out_dir``.

    For demos and tests where no pretrained weights can be downloaded: the
    vocabulary is the special tokens plus the ``vocab_size`` most frequent
    characters of ``texts`` (Chinese is tokenised per character); the model is
    built from a config and saved with ``save_pretrained(safe_serialization=True)``
    (``model.safetensors``), so ``from_pretrained(out_dir)`` reads it like any
    downloaded model directory.  ``task``: sequence or token classification.
    """
    if arch not in _ARCHS or task not in _ARCHS[arch][1]:
        raise ValueError(f"make_random_model_dir: arch must be one of {sorted(_ARCHS)} and task "
                         f"sequence or token, got arch={arch!r} task={task!r}")
    config_cls, models, tokenizer_cls = _ARCHS[arch]
    os.makedirs(out_dir, exist_ok=True)
    counts = Counter(ch for text in texts for ch in text if not ch.isspace())
    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    chars = [ch for ch, _ in counts.most_common(vocab_size - len(specials))]
    vocab_file = os.path.join(out_dir, "vocab.txt")
    with open(vocab_file, "w", encoding="utf-8") as f:
        f.write("\n".join(specials + chars) + "\n")
    getattr(paddlenlp_transformers, tokenizer_cls)(vocab_file).save_pretrained(out_dir)
    config = getattr(paddlenlp_transformers, config_cls)(
        vocab_size=len(specials) + len(chars), hidden_size=hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        intermediate_size=4 * hidden_size, max_position_embeddings=max_position,
        num_labels=num_labels, pad_token_id=0)
    paddle.seed(seed)
    getattr(paddlenlp_transformers, models[task])(config).save_pretrained(out_dir,
                                                                        safe_serialization=True)
    return out_dir
