"""ppvarlen samplers + collator inside paddlenlp.trainer.Trainer (tiny random-init models, CPU)."""
import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import paddle
import pytest
from paddlenlp.datasets import MapDataset, load_dataset
from paddlenlp.trainer import TrainerCallback, TrainingArguments
from paddlenlp.transformers import (AutoModelForSequenceClassification,
                                    AutoModelForTokenClassification, AutoTokenizer, BertTokenizer)

from ppvarlen.config import load_config
from ppvarlen.data.sources import load_corpus
from ppvarlen.data.errors import DataError
from ppvarlen.integrations.paddlenlp_trainer import (LengthBatchingTrainer, ModelInputCollator,
                                                     lengths_of, make_random_model_dir)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = dict(vocab_size=400, hidden_size=16, num_layers=1, num_heads=2, max_position=64)
MAX_TOKENS = 256


def sentiment(n):
    cfg = load_config(overrides=["Data.corpus=sentiment", f"Data.limit={n}"])
    return load_corpus(cfg.Data).splits["train"][:n]


def encode(tokenizer, examples, max_length=48):
    rows = []
    for ex in examples:
        enc = tokenizer(ex["text"], max_length=max_length, truncation=True)
        rows.append({"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"],
                     "label": ex["label"], "text": ex["text"]})
    return MapDataset(rows)


@pytest.fixture(scope="module")
def seq_dir(tmp_path_factory):
    examples = sentiment(120)
    path = make_random_model_dir(str(tmp_path_factory.mktemp("ernie_seq")),
                                 [e["text"] for e in examples], num_labels=2, **TINY)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return path, encode(tokenizer, examples)


def training_args(out, **kw):
    base = dict(output_dir=str(out), device="cpu", report_to=[], num_train_epochs=2,
                learning_rate=1e-3, logging_steps=1000, save_strategy="no", disable_tqdm=True,
                seed=7, unified_checkpoint=True)
    base.update(kw)
    return TrainingArguments(**base)


class RecordingTrainer(LengthBatchingTrainer):
    """Records what every optimisation step trained on, and its loss."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.steps = []

    def training_step(self, model, inputs):
        loss = super().training_step(model, inputs)
        self.steps.append((inputs["input_ids"].numpy().copy(), float(loss)))
        return loss


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def make_trainer(model_dir, dataset, args, cls=RecordingTrainer, **kw):
    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return cls(model=model, args=args, train_dataset=dataset, eval_dataset=dataset,
               data_collator=ModelInputCollator(tokenizer, model), max_tokens=MAX_TOKENS, **kw)


def example_ids(dataset, input_ids):
    """Dataset indices of the rows of a padded batch (texts are distinct)."""
    index = {tuple(dataset[i]["input_ids"]): i for i in range(len(dataset))}
    return [index[tuple(int(t) for t in row[:len(row) - int((row == 0).sum())])]
            for row in input_ids]


def test_epochs_reshuffle_and_cover_the_data(seq_dir, tmp_path):
    model_dir, ds = seq_dir
    trainer = make_trainer(model_dir, ds, training_args(tmp_path))
    trainer.train()
    per_epoch = len(trainer.train_batch_sampler())
    assert len(trainer.steps) == 2 * per_epoch
    epochs = [[example_ids(ds, ids) for ids, _ in trainer.steps[e * per_epoch:(e + 1) * per_epoch]]
              for e in (0, 1)]
    for batches in epochs:  # every example exactly once per epoch, within the token budget
        assert sorted(i for b in batches for i in b) == list(range(len(ds)))
    for ids, _ in trainer.steps:
        assert ids.size <= MAX_TOKENS
    assert epochs[0] != epochs[1]  # reshuffled
    sampler = trainer.train_batch_sampler()
    assert sampler.epoch == 1
    # pooled packing: the fixed count is the largest natural count of the run's epochs
    assert sampler.pool_size == 16 and sampler.num_batches == max(sampler.batch_counts([0, 1]))


def test_example_loss_weighting_scales_by_targets_per_batch(seq_dir, tmp_path):
    model_dir, ds = seq_dir
    weighted = make_trainer(model_dir, ds, training_args(tmp_path))
    plain = make_trainer(model_dir, ds, training_args(tmp_path), loss_weighting="batch")
    mean = len(ds) / len(weighted.train_batch_sampler())
    assert weighted.targets_per_batch() == pytest.approx(mean)
    small = min(weighted.train_batch_sampler().epoch_batches(), key=len)
    batch = weighted.data_collator([ds[i] for i in small])
    losses = []
    for trainer in (weighted, plain):
        trainer.model.train()
        paddle.seed(3)  # the same dropout masks
        losses.append(float(trainer.compute_loss(trainer.model, {
            k: paddle.to_tensor(v) for k, v in batch.items()})))
    assert losses[0] == pytest.approx(losses[1] * len(small) / mean, rel=1e-5)
    with pytest.raises(ValueError, match="loss_weighting"):
        make_trainer(model_dir, ds, training_args(tmp_path), loss_weighting="token")


def test_evaluate_and_predict_are_in_dataset_order(seq_dir, tmp_path):
    model_dir, ds = seq_dir
    seen = {}

    def metrics(p):
        seen["labels"] = p.label_ids
        return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}

    trainer = make_trainer(model_dir, ds, training_args(tmp_path), compute_metrics=metrics)
    assert trainer.eval_batch_sampler(ds).batch_size > 1  # read by evaluation_loop
    out = trainer.predict(ds)
    model = trainer.model
    model.eval()
    labels = np.array([ds[i]["label"] for i in range(len(ds))])
    np.testing.assert_array_equal(out.label_ids, labels)
    np.testing.assert_array_equal(seen["labels"], labels)  # compute_metrics sees dataset order
    with paddle.no_grad():
        for i in range(len(ds)):  # one example at a time, no padding at all
            alone = model(input_ids=paddle.to_tensor([ds[i]["input_ids"]]),
                          token_type_ids=paddle.to_tensor([ds[i]["token_type_ids"]]))
            np.testing.assert_allclose(out.predictions[i], alone.numpy()[0], atol=1e-5)
    lengths = lengths_of(ds)
    batches = trainer.eval_batch_sampler(ds).epoch_batches()
    assert [lengths[b].max() for b in batches] == sorted(lengths[b].max() for b in batches)
    acc = float((out.predictions.argmax(-1) == labels).mean())
    assert trainer.evaluate()["eval_accuracy"] == pytest.approx(acc)


def test_token_classification_predictions_in_order(tmp_path):
    examples = sentiment(40)
    path = make_random_model_dir(str(tmp_path / "tok"), [e["text"] for e in examples],
                                 num_labels=3, arch="bert", task="token", **TINY)
    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = []
    for ex in examples:
        ids = tokenizer(ex["text"], max_length=40, truncation=True)["input_ids"]
        rows.append({"input_ids": ids, "labels": [t % 3 for t in ids]})
    ds = MapDataset(rows)
    model = AutoModelForTokenClassification.from_pretrained(path)
    trainer = LengthBatchingTrainer(model=model, args=training_args(tmp_path / "out"),
                                    train_dataset=ds, data_collator=ModelInputCollator(
                                        tokenizer, model), max_tokens=200)
    trainer.train()
    out = trainer.predict(ds)
    model.eval()
    with paddle.no_grad():
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            alone = model(input_ids=paddle.to_tensor([row["input_ids"]])).numpy()[0]
            np.testing.assert_allclose(out.predictions[i, :n], alone, atol=1e-5)
            np.testing.assert_array_equal(out.label_ids[i, :n], row["labels"])
            assert (out.label_ids[i, n:] == -100).all()


def test_collator_emits_exactly_the_forward_inputs(tmp_path):
    vocab = tmp_path / "vocab.txt"  # [PAD] deliberately not id 0
    vocab.write_text("\n".join(["[UNK]", "[CLS]", "[SEP]", "[MASK]", "[PAD]", "好", "书"]) + "\n")
    tokenizer = BertTokenizer(str(vocab))
    assert tokenizer.pad_token_id == 4

    class IdsOnly(paddle.nn.Layer):
        def forward(self, input_ids, labels=None):
            return input_ids

    items = [{"input_ids": [1, 5, 2], "token_type_ids": [0, 0, 0], "label": 1, "text": "好"},
             {"input_ids": [1, 5, 6, 5, 2], "token_type_ids": [0] * 5, "label": 0, "text": "x"}]
    batch = ModelInputCollator(tokenizer, IdsOnly())(items)
    assert set(batch) == {"input_ids", "labels"}
    np.testing.assert_array_equal(batch["input_ids"], [[1, 5, 2, 4, 4], [1, 5, 6, 5, 2]])
    np.testing.assert_array_equal(batch["labels"], [1, 0])

    path = make_random_model_dir(str(tmp_path / "m"), ["好书"], num_labels=2, arch="bert", **TINY)
    model = AutoModelForSequenceClassification.from_pretrained(path)
    batch = ModelInputCollator(tokenizer, model)(items)
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    np.testing.assert_array_equal(batch["attention_mask"], [[1, 1, 1, 0, 0], [1] * 5])
    loss, logits = model(**{k: paddle.to_tensor(v) for k, v in batch.items()})
    assert logits.shape == [2, 2] and float(loss) > 0

    tagged = [{"input_ids": [1, 5, 2], "labels": [0, 1, 0]}, {"input_ids": [1, 2], "labels": [0, 0]}]
    batch = ModelInputCollator(tokenizer, IdsOnly())(tagged)
    np.testing.assert_array_equal(batch["labels"], [[0, 1, 0], [0, 0, -100]])
    with pytest.raises(DataError, match="labels has 2 entries but input_ids has 3"):
        ModelInputCollator(tokenizer, IdsOnly())([{"input_ids": [1, 5, 2], "labels": [0, 1]}])
    with pytest.raises(DataError, match="no input_ids"):
        ModelInputCollator(tokenizer, IdsOnly())([{"text": "好"}])
    with pytest.raises(DataError, match="batch item 1 has fields"):
        ModelInputCollator(tokenizer, IdsOnly())([{"input_ids": [1], "label": 0},
                                                  {"input_ids": [1]}])

    class WithSpans(paddle.nn.Layer):
        def forward(self, input_ids, spans=None):
            return input_ids

    with pytest.raises(DataError, match="field 'spans' holds sequences but its pad value"):
        ModelInputCollator(tokenizer, WithSpans())([{"input_ids": [1, 2], "spans": [0, 1]}])


def test_map_dataset_from_load_dataset(tmp_path):
    data = tmp_path / "train.jsonl"
    rows = [{"input_ids": list(range(1, n + 1)), "label": n % 2, "length": n}
            for n in (5, 3, 9, 1, 4, 7)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    def read(path):
        with open(path) as f:
            for line in f:
                yield json.loads(line)

    ds = load_dataset(read, path=str(data), lazy=False)
    assert isinstance(ds, MapDataset)
    np.testing.assert_array_equal(lengths_of(ds), [5, 3, 9, 1, 4, 7])
    np.testing.assert_array_equal(lengths_of(ds, field="length"), [5, 3, 9, 1, 4, 7])
    with pytest.raises(DataError, match="example #0 has no field 'tokens'"):
        lengths_of(ds, field="tokens")
    empty = MapDataset([{"input_ids": [1]}, {"input_ids": []}])
    with pytest.raises(DataError, match="example #1: field 'input_ids' is empty"):
        lengths_of(empty)


@pytest.mark.parametrize("where", ["mid_epoch", "epoch_end"])
def test_resume_sees_the_same_batches_and_losses(seq_dir, tmp_path, where, monkeypatch):
    """Interrupted in epoch 2 (or right at the end of epoch 1) and resumed from the
    checkpoint: the resumed steps train on the batches, and give the losses, of an
    uninterrupted run (dropout on)."""
    model_dir, ds = seq_dir
    full = make_trainer(model_dir, ds, training_args(tmp_path / "full"))
    full.train()
    per_epoch = len(full.train_batch_sampler())
    ids = [sorted(example_ids(ds, ids)) for ids, _ in full.steps]
    assert ids[:per_epoch] != ids[per_epoch:]  # epochs differ, so the resumed epoch matters
    save_at = per_epoch + 3 if where == "mid_epoch" else per_epoch
    args = dict(save_strategy="steps", save_steps=save_at)
    first = make_trainer(model_dir, ds, training_args(tmp_path / "cut", **args))
    first.add_callback(StopAt(save_at + 2))  # it goes on past the checkpoint, then stops
    first.train()
    assert len(first.steps) == save_at + 2
    ckpt = tmp_path / "cut" / f"checkpoint-{save_at}"
    files = os.listdir(ckpt)
    assert any(f.endswith(".safetensors") and f.startswith("model") for f in files)
    assert any(f.endswith(".safetensors") and f.startswith("optimizer") for f in files)
    assert not any(f.endswith((".pdparams", ".pdopt")) and not f.startswith("scheduler")
                   for f in files), files
    resumed = make_trainer(model_dir, ds, training_args(tmp_path / "cut", **args))
    no_pickle(monkeypatch)  # the checkpoint's rng_state / scheduler files: plain data only
    resumed.train(resume_from_checkpoint=str(ckpt) if where == "mid_epoch" else True)
    assert len(resumed.steps) == len(full.steps) - save_at
    for (ids, loss), (ids_full, loss_full) in zip(resumed.steps, full.steps[save_at:]):
        np.testing.assert_array_equal(ids, ids_full)
        assert loss == pytest.approx(loss_full, abs=1e-6)


def no_pickle(monkeypatch):
    """Any unrestricted unpickling (pickle.load/loads, a fresh Unpickler) fails the test."""
    def refuse(*a, **kw):
        raise AssertionError("unrestricted unpickling during resume")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


def test_resume_refuses_code_in_checkpoint_pickles_and_non_unified(seq_dir, tmp_path,
                                                                  monkeypatch):
    model_dir, ds = seq_dir
    args = dict(save_strategy="steps", save_steps=2)
    first = make_trainer(model_dir, ds, training_args(tmp_path / "run", **args))
    first.add_callback(StopAt(2))
    first.train()
    ckpt = tmp_path / "run" / "checkpoint-2"
    with open(ckpt / "scheduler.pdparams", "wb") as f:
        pickle.dump({"last_epoch": _RunsCode()}, f)
    monkeypatch.chdir(tmp_path)
    # the safe loader runs while paddle.load stays Paddle's own (nothing swapped module-wide)
    from ppvarlen.integrations import paddlenlp_trainer as integration

    seen, find_class = [], integration._PlainDataUnpickler.find_class

    def watch(self, module, name):
        seen.append(paddle.load is original_load)
        return find_class(self, module, name)

    original_load = paddle.load
    monkeypatch.setattr(integration._PlainDataUnpickler, "find_class", watch)
    resumed = make_trainer(model_dir, ds, training_args(tmp_path / "run", **args))
    with pytest.raises(pickle.UnpicklingError,
                       match=r"scheduler.pdparams: refusing to unpickle posix.system"):
        resumed.train(resume_from_checkpoint=str(ckpt))
    assert not (tmp_path / "pwned.txt").exists()
    assert seen and all(seen), "paddle.load was swapped while the checkpoint was read"
    legacy = make_trainer(model_dir, ds, training_args(tmp_path / "run", unified_checkpoint=False))
    with pytest.raises(ValueError, match="unified_checkpoint=True"):
        legacy.train(resume_from_checkpoint=str(ckpt))


DRIVER = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from paddlenlp.trainer import TrainingArguments
    import test_paddlenlp_trainer as T

    model_dir, out = sys.argv[1], sys.argv[2]
    from paddlenlp.transformers import AutoTokenizer
    ds = T.encode(AutoTokenizer.from_pretrained(model_dir), T.sentiment(70))
    args = TrainingArguments(output_dir=out, device="cpu", report_to=[], num_train_epochs=2,
                             learning_rate=1e-3, save_strategy="no", disable_tqdm=True, seed=7)
    trainer = T.make_trainer(model_dir, ds, args,
                             compute_metrics=lambda p: {"acc": float((p.predictions.argmax(-1)
                                                                      == p.label_ids).mean())})
    trainer.train()
    metrics = trainer.evaluate()
    rank = args.dataset_rank
    sampler = trainer.train_batch_sampler()
    batches = {}
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        batches[epoch] = sampler.epoch_batches()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"world": args.dataset_world_size, "steps": len(trainer.steps),
                   "batches": batches, "eval_acc": metrics["eval_acc"],
                   "repeated": sampler.num_repeated_batches}, f)
''')


def test_two_processes_get_equal_batch_counts(seq_dir, tmp_path):
    model_dir, _ = seq_dir
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    tests_dir = os.path.join(REPO, "tests")  # the shared helpers; this module's own folder too
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, tests_dir,
                                                       os.path.dirname(os.path.abspath(__file__)),
                                                       os.environ.get("PYTHONPATH", "")]))
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    r = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node",
                        "2", "--log_dir", str(logs), str(driver), model_dir, str(out)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    tail = "".join(open(logs / f).read()[-3000:] for f in sorted(os.listdir(logs)))
    assert r.returncode == 0, tail
    ranks = [json.load(open(out / f"rank{r}.json")) for r in (0, 1)]
    assert [x["world"] for x in ranks] == [2, 2]
    assert ranks[0]["steps"] == ranks[1]["steps"] > 0
    for epoch in ("0", "1"):
        a, b = ranks[0]["batches"][epoch], ranks[1]["batches"][epoch]
        assert len(a) == len(b) and a != b
        assert {i for batch in a + b for i in batch} == set(range(70))
    assert ranks[0]["steps"] == 2 * len(ranks[0]["batches"]["0"])
    assert ranks[0]["eval_acc"] == ranks[1]["eval_acc"]  # each rank evaluated the whole set


def test_bucket_sampler_training_and_eval_guard(seq_dir, tmp_path):
    model_dir, ds = seq_dir
    bounds = [16, 32, 48]
    trainer = make_trainer(model_dir, ds, training_args(tmp_path, num_train_epochs=1),
                           bucket_boundaries=bounds)
    trainer.train()
    lengths = lengths_of(ds)
    seen = []
    for ids, _ in trainer.steps:
        batch = example_ids(ds, ids)
        buckets = {int(np.searchsorted(bounds, lengths[i])) for i in batch}
        assert len(buckets) == 1  # one bucket per batch
        seen += batch
    assert sorted(seen) == list(range(len(ds)))
    trainer.args.max_evaluate_steps = 2
    with pytest.raises(ValueError, match="max_evaluate_steps"):
        trainer.evaluate()

    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    collate = ModelInputCollator(AutoTokenizer.from_pretrained(model_dir), model)
    fixed = LengthBatchingTrainer(model=model, data_collator=collate, train_dataset=ds,
                                  args=training_args(tmp_path, per_device_train_batch_size=8),
                                  bucket_boundaries=bounds)  # no max_tokens: 8 per batch
    batches = fixed.train_batch_sampler().epoch_batches()
    assert max(len(b) for b in batches) == 8
    assert all(len({int(np.searchsorted(bounds, lengths[i])) for i in b}) == 1 for b in batches)
    assert fixed.eval_batch_sampler(ds).max_tokens == 8 * int(lengths.max())  # eval default
    with pytest.raises(ValueError, match="give max_tokens"):
        LengthBatchingTrainer(model=model, data_collator=collate, train_dataset=ds,
                              args=training_args(tmp_path))


def test_core_package_does_not_import_paddlenlp_trainer():
    code = ("import sys, ppvarlen, ppvarlen.data.samplers, ppvarlen.data.collate, "
            "ppvarlen.data.order, ppvarlen.config\n"
            "bad = sorted(m for m in sys.modules if m.startswith('paddlenlp.trainer'))\n"
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env=dict(os.environ, PYTHONPATH=REPO), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
