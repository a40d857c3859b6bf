"""What differs per task inside one training step: the model call, the loss, the token counts.

Classification and tagging models take ``(input_ids, seq_len, labels)``; the seq2seq model
takes both sides, ``(src_ids, src_len, tgt_in, tgt_len, tgt_out)`` (docs/DESIGN.md "Batches").
"""
import paddle
import paddle.nn.functional as F


def to_tensors(batch):
    """The model inputs of a classification / tagging batch."""
    return paddle.to_tensor(batch["input_ids"]), paddle.to_tensor(batch["seq_len"])


def batch_loss(model, batch, task, label_smoothing=0.0):
    """Mean float32 loss of one batch (pads ignored by the models' losses)."""
    if task == "seq2seq":
        fields = ("src_ids", "src_len", "tgt_in", "tgt_len", "tgt_out")
        loss, _ = model(*[paddle.to_tensor(batch[k]) for k in fields])
        return loss.astype("float32")
    ids, seq_len = to_tensors(batch)
    labels = paddle.to_tensor(batch["labels"])
    if label_smoothing and task == "classification":
        logits = model(ids, seq_len)
        return F.cross_entropy(logits.astype("float32"), labels, label_smoothing=label_smoothing)
    loss, _ = model(ids, seq_len, labels)
    return loss.astype("float32")


def batch_size(batch):
    return len(batch["src_len"] if "src_len" in batch else batch["seq_len"])


def token_counts(batch):
    """(real tokens, padded tokens) of a batch; seq2seq counts both sides."""
    if "src_ids" in batch:
        real = int(batch["src_len"].sum()) + int(batch["tgt_len"].sum())
        return real, int(batch["src_ids"].size) + int(batch["tgt_in"].size)
    return int(batch["seq_len"].sum()), int(batch["input_ids"].size)
