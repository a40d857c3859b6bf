"""Masked-character pretraining (MLM) of the ``transformer_cls`` encoder on in-package text.

    python tools/pretrain.py -c configs/sentiment/pretrain_mlm.yaml

Text: the TRAIN split of ``Data.corpus`` (never dev or test) plus the train
splits of ``Pretrain.extra_corpora`` (e.g. People's Daily), encoded with the
classifier's own vocabulary -- built from ``Data`` exactly as the trainer
builds it -- so ``Model.init_from`` can load the embedding row for row.

Masking as in BERT: ``Pretrain.mask_prob`` of the real, non-special positions
are predicted; 80% of them are replaced by the mask id, 10% by a random token,
10% left as they are.  The built-in vocabulary has no [MASK]; [BOS] never
occurs in a classification input, so it serves as the mask.  The output layer
is tied to the token embedding.  Batches are token-budget batches of
length-sorted sequences (``Data.max_tokens``), shuffled every epoch.

Writes ``Global.output_dir``: ``encoder.safetensors`` (every weight except the
classification heads; the header records the vocabulary's sha256),
``vocab.txt`` / ``encoder.json``, ``pretrain_log.jsonl`` and
``pretrain_metrics.json``.
"""
import hashlib
import json
import os
import time

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from ..config import ConfigError, save_config
from ..data.order import length_sorted_batches
from ..utils.io import atomic_write_json
from ..utils.log import get_logger, setup_logging

log = get_logger("ppvarlen.pretrain")

ENCODER_FILE = "encoder.safetensors"
HEAD_PREFIXES = ("classifier.", "wide_head.")  # task heads: trained by fine-tuning, not here


def vocab_sha256(encoder):
    """Fingerprint of the token list (id order matters: it is the embedding's row order)."""
    return hashlib.sha256("\n".join(encoder.tokens).encode("utf-8")).hexdigest()


def _chunks(ids, max_len, cls_id, sep_id):
    """[CLS] piece [SEP] windows of ``ids`` (no overlap), each at most ``max_len`` long."""
    body = max_len - 2
    return [[cls_id] + ids[i:i + body] + [sep_id] for i in range(0, max(len(ids), 1), body)]


def pretraining_sequences(data_cfg, extra_corpora):
    """-> (encoder, list of id lists, {source: count}) from train splits only."""
    from ..data.corpora import load_corpus
    from ..data.dataset import build_datasets

    bundle = build_datasets(data_cfg, task_hint="classification", splits=("train",))
    enc = bundle.encoder
    sequences = [list(bundle.train[i]["input_ids"]) for i in range(len(bundle.train))]
    counts = {f"{data_cfg.corpus}/train": len(sequences)}
    for name in extra_corpora:
        # the same split seed: with another seed, "train" of the default split holds test texts
        corpus = load_corpus({"corpus": name, "split_seed": data_cfg.split_seed})
        key = "tokens" if corpus.task == "tagging" else "text"
        if corpus.task not in ("tagging", "classification"):
            raise ConfigError(f"Pretrain.extra_corpora: {name!r} is a {corpus.task} corpus; "
                              f"use a classification or tagging corpus (e.g. people_daily_ner)")
        before = len(sequences)
        for ex in corpus.splits["train"]:
            text = "".join(ex[key]) if key == "tokens" else ex[key]
            ids = enc.encode(enc.tokenize(text))
            sequences += _chunks(ids, data_cfg.max_len, enc.cls_id, enc.sep_id)
        counts[f"{name}/train"] = len(sequences) - before
    return enc, sequences, counts


def mask_batch(sequences, pad_id, mask_id, vocab_size, mask_prob, rng, first_real_id):
    """Pad ``sequences`` and mask them -> numpy (input_ids, seq_len, flat positions, targets).

    Only real positions holding an ordinary token (id >= ``first_real_id``) are
    candidates; every sequence with one gets at least one prediction.
    """
    lengths = np.array([len(s) for s in sequences], dtype="int64")
    ids = np.full((len(sequences), lengths.max()), pad_id, dtype="int64")
    for b, s in enumerate(sequences):
        ids[b, :len(s)] = s
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
    return corrupted, lengths, positions.astype("int64"), targets.astype("int64")


class MaskedLM(nn.Layer):
    """``backbone.encode`` + transform + output layer tied to the token embedding."""

    def __init__(self, backbone):
        super().__init__()
        hidden = backbone.token_embedding.weight.shape[1]
        self.backbone = backbone
        self.transform = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.output_bias = self.create_parameter([backbone.token_embedding.weight.shape[0]],
                                                 is_bias=True)

    def forward(self, input_ids, seq_len, positions, targets):
        h, _ = self.backbone.encode(input_ids, seq_len)
        picked = paddle.gather(h.reshape([-1, h.shape[-1]]), positions)
        picked = self.norm(F.gelu(self.transform(picked)))
        logits = paddle.matmul(picked, self.backbone.token_embedding.weight, transpose_y=True)
        logits = (logits + self.output_bias).astype("float32")
        loss = F.cross_entropy(logits, targets.unsqueeze(-1))
        correct = (logits.argmax(axis=-1) == targets).astype("float32").mean()
        return loss, correct


def _check(cfg):
    if cfg.Model.name != "transformer_cls":
        raise ConfigError(f"Model.name={cfg.Model.name}: MLM pretraining is built for "
                          f"transformer_cls (its encode()); set Model.name: transformer_cls")
    if not 0.0 < cfg.Pretrain.mask_prob < 1.0:
        raise ConfigError(f"Pretrain.mask_prob={cfg.Pretrain.mask_prob}: use a probability in (0, 1)")
    if cfg.Model.init_from:
        raise ConfigError("Model.init_from is set in a pretraining config; pretraining starts "
                          "from scratch -- remove it")


def pretrain(cfg):
    """MLM-pretrain per ``cfg``; returns the metrics written to pretrain_metrics.json."""
    from ..models import build_model
    from ..models.weights import save_weights
    from .optim import build_optimizer

    setup_logging(cfg.Global.log_level)
    _check(cfg)
    started = time.time()
    paddle.seed(cfg.Global.seed)
    rng = np.random.default_rng(cfg.Global.seed)
    enc, sequences, counts = pretraining_sequences(cfg.Data, cfg.Pretrain.extra_corpora)
    num_tokens = int(sum(len(s) for s in sequences))
    log.info("pretraining text: %s sequences, %d tokens (%s)", len(sequences), num_tokens, counts)
    batches = length_sorted_batches([len(s) for s in sequences], cfg.Data.max_tokens,
                                    cfg.Data.max_sentences)
    total_steps = cfg.Train.max_steps or cfg.Train.epochs * len(batches)
    backbone = build_model(cfg.Model, enc.vocab_size, 2, enc.pad_id, "classification")
    model = MaskedLM(backbone)
    optimizer, scheduler = build_optimizer(model, cfg.Optimizer, total_steps)
    os.makedirs(cfg.Global.output_dir, exist_ok=True)
    save_config(cfg, os.path.join(cfg.Global.output_dir, "config.yaml"))
    log_path = os.path.join(cfg.Global.output_dir, "pretrain_log.jsonl")
    step, train_time, window, rec = 0, 0.0, [], None
    model.train()
    with open(log_path, "w", encoding="utf-8") as log_file:
        while step < total_steps:
            epoch_start = step
            for b in rng.permutation(len(batches)):
                t0 = time.perf_counter()
                arrays = mask_batch([sequences[i] for i in batches[b]], enc.pad_id, enc.bos_id,
                                    enc.vocab_size, cfg.Pretrain.mask_prob, rng, first_real_id=6)
                if not len(arrays[3]):  # only [UNK]s and specials: nothing to predict
                    continue
                loss, acc = model(*[paddle.to_tensor(a) for a in arrays])
                loss.backward()
                optimizer.step()
                optimizer.clear_grad()
                scheduler.step()
                step += 1
                train_time += time.perf_counter() - t0
                window.append((float(loss), float(acc), int(arrays[1].sum())))
                if step % cfg.Train.log_every == 0 or step == total_steps:
                    rec = {"step": step, "loss": float(np.mean([w[0] for w in window])),
                           "masked_acc": float(np.mean([w[1] for w in window])),
                           "lr": float(optimizer.get_lr()), "tokens": sum(w[2] for w in window),
                           "train_time_s": round(train_time, 2)}
                    log_file.write(json.dumps(rec) + "\n")
                    log_file.flush()
                    log.info("step %d/%d  mlm loss %.4f  masked acc %.3f  lr %.2e", step, total_steps,
                             rec["loss"], rec["masked_acc"], rec["lr"])
                    window = []
                if step >= total_steps:
                    break
            if step == epoch_start:
                raise ConfigError("pretraining: no sequence holds an ordinary token to mask (only "
                                  "[UNK] and specials); check Data.min_freq / Data.limit")
    out = cfg.Global.output_dir
    save_weights(backbone, os.path.join(out, ENCODER_FILE), skip_prefixes=HEAD_PREFIXES,
                 metadata={"vocab_sha256": vocab_sha256(enc), "vocab_size": str(enc.vocab_size)})
    enc.save(out)
    result = {"steps": step, "sequences": counts, "tokens_per_epoch": num_tokens,
              "final_mlm_loss": rec["loss"], "final_masked_acc": rec["masked_acc"],
              "train_time_s": round(train_time, 2), "wall_time_s": round(time.time() - started, 2),
              "encoder_file": os.path.join(out, ENCODER_FILE)}
    atomic_write_json(os.path.join(out, "pretrain_metrics.json"), result)
    log.info("wrote %s (%d steps, %.1f min)", result["encoder_file"], step, result["wall_time_s"] / 60)
    return result
