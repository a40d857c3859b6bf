"""Linear-chain CRF whose training loss and decoder use ONE transition convention.

Decoding is ``paddle.text.viterbi_decode`` (the op behind
``paddle.text.ViterbiDecoder``), which survives ``to_static``.  Its convention,
read from the CPU kernel (paddle/phi/kernels/cpu/viterbi_decode_kernel.cc):
``transitions[i, j]`` scores moving FROM tag i TO tag j (``alpha[b, i] +
trans[i, j]``, max over i).  With ``include_bos_eos_tag=True`` the kernel
reuses the matrix's last row as start scores and the second-to-last row as stop
scores while still treating those two tags as ordinary candidates at every
position, i.e. it wants two helper tags inside the emissions.  We keep the T
real tags only and call it with ``include_bos_eos_tag=False``, folding our own
``start`` [T] / ``stop`` [T] scores into the potentials of each sequence's
first / real-last position -- the same path scores, no helper tags.

The loss is the exact negative log-likelihood under the same scores:

    score(y) = start[y_0] + sum_t emit[t, y_t] + sum_{t>0} trans[y_{t-1}, y_t] + stop[y_{n-1}]
    nll = logsumexp_y score(y) - score(gold)

Exporters read ``transitions``, ``start``, ``stop`` (the numpy Viterbi of the
ONNX path, ppvarlen.utils.viterbi, takes the same three).
(tested against brute-force enumeration in tests/models/test_crf.py).
"""
import paddle
import paddle.nn as nn

from .masks import IGNORE_INDEX, sequence_mask


class LinearChainCRF(nn.Layer):
    def __init__(self, num_tags):
        super().__init__()
        self.num_tags = num_tags
        init = nn.initializer.Uniform(-0.1, 0.1)
        self.transitions = self.create_parameter([num_tags, num_tags], default_initializer=init)
        self.start = self.create_parameter([num_tags], default_initializer=init)
        self.stop = self.create_parameter([num_tags], default_initializer=init)

    # ------------------------------------------------------------ decoding
    def decode(self, emissions, seq_len):
        """Viterbi tags [B, L] int64 (0 on pads) for float ``emissions`` [B, L, T]."""
        emissions = emissions.astype("float32")
        shape = paddle.shape(emissions)
        max_len = shape[1]
        positions = paddle.arange(max_len, dtype="int64").unsqueeze(0)
        is_first = (positions == 0).astype("float32").unsqueeze(-1)
        is_last = (positions == (seq_len.astype("int64") - 1).unsqueeze(1)).astype("float32").unsqueeze(-1)
        potentials = emissions + is_first * self.start + is_last * self.stop
        # The kernel returns paths of width max(lengths), not L, and under PIR its
        # declared output is a rank-1 float tensor (the runtime one is [B, max] int64).
        # A dummy full-length row makes the width L, so the shape is known without
        # reading the path's own; the row is dropped again.  The kernel also indexes
        # out of range on a length-0 row: decode it with length 1 and mask below.
        dummy = paddle.zeros([1, max_len, shape[2]], dtype="float32")
        lengths = paddle.concat([paddle.clip(seq_len.astype("int64"), min=1), max_len.reshape([1])])
        _, path = paddle.text.viterbi_decode(paddle.concat([potentials, dummy]), self.transitions,
                                             lengths, False)
        path = path.astype("int64").reshape([-1, max_len])[:-1]
        return path * sequence_mask(seq_len, max_len, dtype="int64")

    # ------------------------------------------------------------ training loss
    def log_partition(self, emissions, seq_len):
        """log sum over all tag paths of exp(score), per sequence: [B] float32."""
        emissions = emissions.astype("float32")
        mask = sequence_mask(seq_len, paddle.shape(emissions)[1], dtype="float32")
        alpha = self.start.unsqueeze(0) + emissions[:, 0]  # [B, T]
        trans = self.transitions.unsqueeze(0)  # [1, T_from, T_to]
        for t in range(1, emissions.shape[1]):  # the loss runs eagerly; decode is the graph path
            step = paddle.logsumexp(alpha.unsqueeze(2) + trans, axis=1) + emissions[:, t]
            keep = mask[:, t : t + 1]
            alpha = keep * step + (1.0 - keep) * alpha  # finished sequences keep their alpha
        return paddle.logsumexp(alpha + self.stop.unsqueeze(0), axis=1)

    def path_score(self, emissions, tags, seq_len):
        """score(tags) per sequence [B]; ``tags`` may hold anything on pad positions."""
        emissions = emissions.astype("float32")
        max_len = paddle.shape(emissions)[1]
        mask = sequence_mask(seq_len, max_len, dtype="float32")
        tags = paddle.where(mask > 0, tags.astype("int64"), paddle.zeros_like(tags, dtype="int64"))
        emit = paddle.take_along_axis(emissions, tags.unsqueeze(-1), axis=2).squeeze(-1)
        score = (emit * mask).sum(axis=1)
        if tags.shape[1] > 1:  # eager-only (see log_partition); a length-1 batch has no pairs
            pair_index = tags[:, :-1] * self.num_tags + tags[:, 1:]
            pair = paddle.gather(self.transitions.reshape([-1]), pair_index.reshape([-1]))
            score += (pair.reshape(pair_index.shape) * mask[:, 1:]).sum(axis=1)
        score += paddle.gather(self.start, tags[:, 0])
        last_index = paddle.clip(seq_len.astype("int64") - 1, min=0).unsqueeze(1)
        last_tag = paddle.take_along_axis(tags, last_index, axis=1).squeeze(1)
        score += paddle.gather(self.stop, last_tag)
        return score

    def nll(self, emissions, tags, seq_len):
        """Mean negative log-likelihood of gold ``tags`` [B, L] over the non-empty sequences."""
        self._check_tags(tags, seq_len)
        per_seq = self.log_partition(emissions, seq_len) - self.path_score(emissions, tags, seq_len)
        non_empty = (seq_len > 0).astype("float32")  # an empty row has no path to score
        return (per_seq * non_empty).sum() / paddle.clip(non_empty.sum(), min=1.0)

    def _check_tags(self, tags, seq_len):
        if not paddle.in_dynamic_mode():
            return
        real = sequence_mask(seq_len, tags.shape[1])
        bad = real & ((tags < 0) | (tags >= self.num_tags))
        if bool(bad.any()):
            row, col = [int(v) for v in paddle.nonzero(bad)[0].numpy()]
            value = int(tags[row, col])
            hint = ("a CRF needs a tag for every real token; -100 inside the sequence usually "
                    "means special tokens were added -- set Data.add_special_tokens=false"
                    if value == IGNORE_INDEX else f"tags must be in [0, {self.num_tags})")
            raise ValueError(f"CRF labels: batch row {row}, position {col} (seq_len "
                             f"{int(seq_len[row])}) has tag {value}; {hint}")
