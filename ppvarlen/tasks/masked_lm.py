"""Masked-LM: pretrain a classifier's encoder on text, trained by the ordinary Trainer.

    python tools/train.py -c configs/sentiment/pretrain_mlm.yaml     (Train.task: masked_lm)

Text: the TRAIN split of ``Data.corpus`` plus the train splits of ``Pretrain.extra_corpora``
(in ``Data.max_len`` chunks), encoded with the classifier's own vocabulary so that
``Model.init_from`` can load the embedding row for row.  Dev/test text is only evaluated
(masked accuracy with a fixed mask per batch), never trained on.

Masking as in BERT: ``Pretrain.mask_prob`` of the real, non-special positions are predicted;
80% of them are replaced by the mask id, 10% by a random token, 10% left as they are.  The
built-in vocabulary has no [MASK]; [BOS] never occurs in a classification input, so it serves
as the mask.  The mask of a training batch is drawn from the Paddle generator the Trainer
re-seeds at every step, so a resumed run masks exactly as an uninterrupted one.

At the end the best checkpoint's encoder is written to ``Global.output_dir/encoder.safetensors``
(without the classification heads; the header records the vocabulary's sha256) with
``vocab.txt`` / ``encoder.json`` beside it.
"""
import os

import numpy as np

from ..config import ConfigError
from ..data.collate import pad_sequences
from ..data.sources import load_corpus
from ..data.vocab import vocab_sha256
from .base import Task

ENCODER_FILE = "encoder.safetensors"
FIRST_ORDINARY_ID = 6  # [PAD] [UNK] [CLS] [SEP] [BOS] [EOS] come first in a built vocabulary


def chunks(ids, max_len, cls_id, sep_id):
    """[CLS] piece [SEP] windows of ``ids`` (no overlap), each at most ``max_len`` long."""
    body = max_len - 2
    return [[cls_id] + ids[i:i + body] + [sep_id] for i in range(0, max(len(ids), 1), body)]


def mask_tokens(ids, mask_id, vocab_size, mask_prob, rng, first_real_id=FIRST_ORDINARY_ID):
    """Mask a padded [B, L] id array -> (corrupted ids, flat positions, targets).

    Only positions holding an ordinary token (id >= ``first_real_id``: never a pad, special
    token or [UNK]) are candidates; every row with one gets at least one prediction.
    """
    candidate = ids >= first_real_id
    chosen = candidate & (rng.random(ids.shape) < mask_prob)
    for b in np.flatnonzero(~chosen.any(axis=1) & candidate.any(axis=1)):
        chosen[b, rng.choice(np.flatnonzero(candidate[b]))] = True
    targets = ids[chosen]
    action = rng.random(targets.shape)
    corrupted = ids.copy()
    rows, cols = np.nonzero(chosen)
    corrupted[rows, cols] = np.where(action < 0.8, mask_id,
                                     np.where(action < 0.9, rng.integers(first_real_id, vocab_size,
                                                                         targets.shape), targets))
    positions = rows * ids.shape[1] + cols
    return corrupted, positions.astype("int64"), targets.astype("int64")


def mask_batch(sequences, pad_id, mask_id, vocab_size, mask_prob, rng, first_real_id):
    """Pad ``sequences`` and mask them -> numpy (input_ids, seq_len, flat positions, targets)."""
    lengths = np.array([len(s) for s in sequences], dtype="int64")
    ids = pad_sequences(sequences, pad_id, int(lengths.max()))
    corrupted, positions, targets = mask_tokens(ids, mask_id, vocab_size, mask_prob, rng,
                                                first_real_id)
    return corrupted, lengths, positions, targets


class MaskedLMTask(Task):
    name = "masked_lm"
    main_metric = "masked_acc"
    reads = ("classification", "tagging")  # any corpus with text
    default_special_tokens = True  # the classifier's inputs: [CLS] text [SEP]
    servable = False
    export_view = None

    # ------------------------------------------------------------ data
    def example_ids(self, encoder, ex, where, tag_ids):
        text = "".join(ex["tokens"]) if "tokens" in ex else ex["text"]
        return encoder.encode(encoder.tokenize(text)), None

    def extra_train_items(self, corpora, data_cfg, encoder, first_doc_id):
        items, counts = [], {}
        for name in corpora:
            # the same split seed: with another seed, "train" of the default split holds test texts
            corpus = load_corpus({"corpus": name, "split_seed": data_cfg.split_seed})
            if corpus.task not in self.reads:
                raise ConfigError(f"Pretrain.extra_corpora: {name!r} is a {corpus.task} corpus; "
                                  f"use a classification or tagging corpus (e.g. people_daily_ner)")
            before = len(items)
            for ex in corpus.splits["train"]:
                ids, _ = self.example_ids(encoder, ex, name, None)
                for chunk in chunks(ids, data_cfg.max_len, encoder.cls_id, encoder.sep_id):
                    items.append({"input_ids": chunk, "doc_id": first_doc_id + len(items)})
            counts[f"{name}/train"] = len(items) - before
        return items, counts

    # ------------------------------------------------------------ training
    def check_train_config(self, cfg):
        if not 0.0 < cfg.Pretrain.mask_prob < 1.0:
            raise ConfigError(f"Pretrain.mask_prob={cfg.Pretrain.mask_prob}: use a probability "
                              f"in (0, 1)")
        if cfg.Model.init_from:
            raise ConfigError("Model.init_from is set in a pretraining config; pretraining starts "
                              "from scratch -- remove it")
        if cfg.Train.label_smoothing:
            raise ConfigError("Train.label_smoothing: the masked-LM loss is not smoothed; set it "
                              "to 0")

    def num_labels(self, encoder, label_names):
        return 2  # the wrapped classifier's head: never trained here, not saved

    def configure_model(self, model, cfg, encoder):
        if encoder.bos_id is None:
            raise ConfigError("Data.tokenizer: masked-LM uses [BOS] as its mask token and a "
                              "pretrained BERT/ERNIE vocabulary has none; use tokenizer: char")
        model.mask_id, model.mask_prob = encoder.bos_id, cfg.Pretrain.mask_prob

    def _masked(self, layer, batch, rng):
        import paddle

        ids, positions, targets = mask_tokens(batch["input_ids"], layer.mask_id, layer.vocab_size,
                                              layer.mask_prob, rng)
        weight = 1.0
        if not len(targets):  # only [UNK]s and specials: predict [CLS] with zero weight
            positions, targets, weight = np.zeros(1, "int64"), ids[:1, 0].copy(), 0.0
        tensors = [paddle.to_tensor(a) for a in (ids, batch["seq_len"], positions)]
        return tensors, paddle.to_tensor(targets), positions, weight

    def loss(self, model, batch, label_smoothing=0.0):
        import paddle

        layer = getattr(model, "_layers", model)  # a DataParallel wrapper keeps the settings inside
        seed = int(paddle.randint(0, 2 ** 31 - 1, [1]).item())  # the step's seeded generator
        inputs, targets, _, weight = self._masked(layer, batch, np.random.default_rng(seed))
        loss, _ = model(*inputs, targets)
        return loss.astype("float32") * weight

    def predict_batch(self, model, batch, decoding, padding_side):
        """Per example [loss sum, correct, masked] under a fixed mask (seeded by its doc ids)."""
        import paddle.nn.functional as F

        rng = np.random.default_rng([int(d) for d in batch["doc_id"]])
        inputs, targets, positions, weight = self._masked(model, batch, rng)
        logits = model(*inputs)
        losses = F.cross_entropy(logits, targets.unsqueeze(-1), reduction="none").numpy()[:, 0]
        correct = (logits.argmax(axis=-1) == targets).numpy()
        rows = positions // batch["input_ids"].shape[1]
        out = np.zeros((len(batch["seq_len"]), 3))
        np.add.at(out, rows, np.stack([losses, correct, np.ones_like(losses)], 1) * weight)
        return list(out)

    def report(self, dataset, outputs, label_names, encoder=None):
        loss, correct, masked = np.sum(outputs, axis=0) if len(outputs) else (0.0, 0.0, 0.0)
        return {"mlm_loss": float(loss / masked) if masked else None,
                "masked_acc": float(correct / masked) if masked else 0.0,
                "masked_tokens": int(masked), "num_examples": len(outputs)}

    def write_artifacts(self, model, data, out_dir):
        path = os.path.join(out_dir, ENCODER_FILE)
        enc = data.encoder
        model.save_encoder(path, {"vocab_sha256": vocab_sha256(enc),
                                  "vocab_size": str(enc.vocab_size)})
        enc.save(out_dir)
        return {"encoder_file": path, "pretraining_text": data.stats["train"].get("sources")}
