"""Transformer encoder-decoder for variable-length source -> variable-length target (g2p).

One character vocabulary covers source characters and target letters/digits/space: the
target is tokenised per character, so the output alphabet is ~100 symbols (letters, digits,
space, kept punctuation) shared by every syllable and no syllable is out of vocabulary; the price
is targets ~3.8x longer than sources, which is exactly the length mismatch this model exists to
exercise.  Masks assume right padding (the Collator's default).

Where padding goes wrong on the target side, and what this file does about it:
* encoder self-attention and decoder cross-attention get the source key-padding mask;
* decoder self-attention gets the causal mask AND the target key-padding mask, combined as keep
  masks and turned additive once (adding two additive masks would overflow to -inf);
* teacher forcing: ``tgt_in`` = BOS y1..yn, ``tgt_out`` = y1..yn EOS, pads -100 -> no loss;
* decoding: every sequence stops at its own EOS (finished rows are frozen, their later
  steps are never read) or at its own limit ``max_len_a * src_len + max_len_b``;
* incremental decoding keeps the self-attention keys/values of past steps and the
  cross-attention keys/values of the memory (computed once), stacked per layer so a single
  step is a plain tensor function (``decode_step``) that ``paddle.jit.to_static`` can trace.
"""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.static import InputSpec

from ..config import Config
from .masks import masked_cross_entropy, masked_fill_value, sequence_mask

Cache = nn.MultiHeadAttention.Cache
StaticCache = nn.MultiHeadAttention.StaticCache


def _as_tensor(x):
    return x if isinstance(x, paddle.Tensor) else paddle.to_tensor(x)


def additive(keep, dtype="float32"):
    """Keep mask (bool) -> additive float mask: 0 where kept, most negative finite elsewhere."""
    return (1.0 - keep.astype(dtype)) * masked_fill_value(dtype)


def source_mask(src_len, src_max_len):
    """[B, 1, 1, S] additive mask over source keys."""
    return additive(sequence_mask(src_len, src_max_len)).unsqueeze([1, 2])


def target_mask(tgt_len, tgt_max_len):
    """[B, 1, T, T] additive mask: query t sees keys <= t that are real target positions."""
    positions = paddle.arange(tgt_max_len, dtype="int64")
    causal = positions.unsqueeze(0) <= positions.unsqueeze(1)            # [T, T] (query, key)
    real_keys = sequence_mask(tgt_len, tgt_max_len).unsqueeze([1, 2])   # [B, 1, 1, T]
    return additive(paddle.logical_and(causal.unsqueeze([0, 1]), real_keys))


class Seq2SeqTransformer(nn.Layer):
    def __init__(self, vocab_size, hidden_size=128, num_heads=4, ffn_size=512, num_layers=2,
                 num_decoder_layers=2, dropout=0.1, max_position=512, pad_id=0, bos_id=4,
                 eos_id=5, label_smoothing=0.0, max_len_a=8, max_len_b=10, output_size=None):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"Model.hidden_size ({hidden_size}) must be divisible by "
                             f"Model.num_heads ({num_heads})")
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        # ids < output_size can be generated (the vocabulary lists the target alphabet first,
        # TextEncoder.build_seq2seq); the output layer covers only those
        output_size = vocab_size if output_size is None else output_size
        if not max(pad_id, bos_id, eos_id) < output_size <= vocab_size:
            raise ValueError(f"output_size {output_size} must cover the special ids and be <= "
                             f"vocab_size {vocab_size}")
        self.vocab_size, self.output_size, self.max_position = vocab_size, output_size, max_position
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.label_smoothing = label_smoothing
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self.scale = hidden_size ** 0.5
        self.embed = nn.Embedding(vocab_size, hidden_size)  # shared: one char vocabulary
        self.src_pos = nn.Embedding(max_position, hidden_size)
        self.tgt_pos = nn.Embedding(max_position, hidden_size)
        self.dropout = nn.Dropout(dropout)
        enc_layer = nn.TransformerEncoderLayer(hidden_size, num_heads, ffn_size, dropout,
                                               normalize_before=True)
        dec_layer = nn.TransformerDecoderLayer(hidden_size, num_heads, ffn_size, dropout,
                                               normalize_before=True)
        self.encoder = nn.TransformerEncoder(enc_layer, num_layers, nn.LayerNorm(hidden_size))
        self.decoder = nn.TransformerDecoder(dec_layer, num_decoder_layers,
                                             nn.LayerNorm(hidden_size))
        self.out_proj = nn.Linear(hidden_size, output_size)
        # added to the next-token log-probs: PAD and BOS are never generated (not a weight).
        # Added after log_softmax because Paddle's CPU log_softmax clamps at about -64 (a
        # logit of -1e9 comes out as -64, not -1e9), while oneDNN does not.
        never = np.zeros([output_size], dtype="float32")
        never[[pad_id, bos_id]] = -1e9
        if paddle.in_dynamic_mode():
            self.register_buffer("never_generated", paddle.to_tensor(never), persistable=False)
        else:  # built straight into a static program (the whole-step training benchmark)
            self.never_generated = paddle.to_tensor(never)

    # ------------------------------------------------------------ building blocks

    def _embed(self, ids, positions, table):
        return self.dropout(self.embed(ids) * self.scale + table(positions))

    def check_length(self, length, what):
        """A clear error instead of an index error deep in the position table (eager only)."""
        if paddle.in_dynamic_mode() and int(length) > self.max_position:
            raise ValueError(f"{what} length {int(length)} exceeds Model.max_position="
                             f"{self.max_position}; raise Model.max_position or lower "
                             f"Data.max_source_len / Data.max_target_len")

    def encode(self, src_ids, src_len):
        """Memory [B, S, H] of a right-padded source batch (pad rows are masked, not zero)."""
        self.check_length(src_ids.shape[1], "source")
        positions = paddle.arange(paddle.shape(src_ids)[1], dtype="int64").unsqueeze(0)
        x = self._embed(src_ids, positions, self.src_pos)
        return self.encoder(x, source_mask(src_len, paddle.shape(src_ids)[1]))

    def forward(self, src_ids, src_len, tgt_in, tgt_len, tgt_out=None):
        """Teacher-forced logits [B, T, V] float32; with ``tgt_out`` (loss, logits)."""
        memory = self.encode(src_ids, src_len)
        logits = self.forward_decoder(tgt_in, memory, src_len, tgt_len)
        if tgt_out is None:
            return logits
        return masked_cross_entropy(logits, tgt_out, smoothing=self.label_smoothing), logits

    def forward_decoder(self, tgt_in, memory, src_len, tgt_len):
        """Teacher-forced logits [B, T, V] float32 over a whole target prefix."""
        self.check_length(tgt_in.shape[1], "target")
        tgt_max = paddle.shape(tgt_in)[1]
        positions = paddle.arange(tgt_max, dtype="int64").unsqueeze(0)
        y = self._embed(tgt_in, positions, self.tgt_pos)
        y = self.decoder(y, memory, tgt_mask=target_mask(tgt_len, tgt_max),
                         memory_mask=source_mask(src_len, paddle.shape(memory)[1]))
        return self.out_proj(y).astype("float32")

    def init_cache(self, memory):
        """(self_k, self_v, cross_k, cross_v), each [layers, B, heads, len, head_dim].

        The self-attention cache starts with one masked dummy slot instead of length 0:
        Paddle Inference's oneDNN concat kernel fails on a 0-length cache (and the dummy is
        never attended to, so results are unchanged).
        """
        cross = [layer.cross_attn.compute_kv(memory, memory) for layer in self.decoder.layers]
        cross_k = paddle.stack([k for k, _ in cross])
        dummy = cross_k[:, :, :, :1] * 0.0  # (zeros_like warns under to_static)
        return dummy, dummy, cross_k, paddle.stack([v for _, v in cross])

    def decode_step(self, tokens, src_len, self_k, self_v, cross_k, cross_v):
        """One incremental decoder step: next-token log-probs [B, V] and the grown self cache.

        ``tokens`` [B, 1] are the previous outputs; the step's position is the number of cached
        steps (the cache length minus the dummy slot, whose key is masked).  Source length
        masks the cross attention (the memory itself is in cross_k/v).
        """
        cached = paddle.shape(self_k)[3]
        positions = tokens * 0 + (cached - 1).astype("int64")
        y = self._embed(tokens, positions, self.tgt_pos)
        src_mask = source_mask(src_len, paddle.shape(cross_k)[3])
        # keys: the dummy slot, the cached steps, this step -> hide only the dummy
        self_mask = additive(paddle.arange(cached + 1, dtype="int64") > 0).reshape([1, 1, 1, -1])
        new_k, new_v = [], []
        for i, layer in enumerate(self.decoder.layers):
            cache = (Cache(self_k[i], self_v[i]), StaticCache(cross_k[i], cross_v[i]))
            # memory is unused when the cross-attention cache is static; pass y for shape only
            y, (grown, _) = layer(y, y, tgt_mask=self_mask, memory_mask=src_mask, cache=cache)
            new_k.append(grown.k)
            new_v.append(grown.v)
        logits = self.out_proj(self.decoder.norm(y)[:, -1])
        return self._next_logp(logits), paddle.stack(new_k), paddle.stack(new_v)

    def full_step(self, prefix, memory, src_len):
        """Log-probs [B, V] of the next token by re-running the decoder over ``prefix`` [B, t]."""
        t = paddle.shape(prefix)[1]
        logits = self.forward_decoder(prefix, memory, src_len, paddle.full_like(src_len, t))
        return self._next_logp(logits[:, -1])

    def _next_logp(self, logits):
        """Log-probs of the next token; PAD and BOS get -1e9 (never generated)."""
        return F.log_softmax(logits.astype("float32"), axis=-1) + self.never_generated

    # ------------------------------------------------------------ decoding

    def length_limits(self, src_len, max_len=None):
        """Per-sequence cap on generated tokens (EOS included): a * src_len + b, <= max_len."""
        if max_len is not None and max_len < 1:
            raise ValueError(f"max_len must be >= 1 (tokens including EOS), got {max_len}")
        cap = self.max_position if max_len is None else min(max_len, self.max_position)
        limits = (src_len.astype("float32") * float(self.max_len_a)).floor().astype("int64")
        limits = limits + int(self.max_len_b)
        return paddle.clip(limits, max=cap)

    def _strip(self, rows):
        """Token lists up to (not including) EOS."""
        out = []
        for row in rows:
            row = list(row)
            out.append(row[:row.index(self.eos_id)] if self.eos_id in row else row)
        return out

    @paddle.no_grad()
    def greedy_decode(self, src_ids, src_len, max_len=None, use_cache=True):
        """Greedy outputs as lists of token ids (no BOS/EOS), one per source, in input order.

        ``use_cache=False`` recomputes the decoder over the whole prefix at every step
        (slow; the reference that the cached path is tested against).
        """
        src_ids, src_len = _as_tensor(src_ids), _as_tensor(src_len)
        memory = self.encode(src_ids, src_len)
        limits = self.length_limits(src_len, max_len)
        batch = paddle.shape(src_ids)[0]
        tokens = paddle.full([batch, 1], self.bos_id, dtype="int64")
        finished = paddle.zeros([batch], dtype="bool")
        cache = self.init_cache(memory) if use_cache else None
        for t in range(int(limits.max())):
            if use_cache:
                logp, self_k, self_v = self.decode_step(tokens[:, -1:], src_len, *cache)
                cache = (self_k, self_v) + cache[2:]
            else:
                logp = self.full_step(tokens, memory, src_len)
            nxt = logp.argmax(axis=-1)
            # a sequence at its own limit ends now (what a finished one emits is never read)
            nxt = paddle.where(limits <= t + 1, paddle.full_like(nxt, self.eos_id), nxt)
            tokens = paddle.concat([tokens, nxt.unsqueeze(1)], axis=1)
            finished = paddle.logical_or(finished, nxt == self.eos_id)
            if bool(finished.all()):
                break
        return self._strip(tokens[:, 1:].numpy().tolist())

    @paddle.no_grad()
    def beam_search(self, src_ids, src_len, beam_size=4, length_penalty=1.0, max_len=None,
                    return_scores=False):
        """Best beam per source (lists of ids, no BOS/EOS), ranked by score / lp(length);
        with ``return_scores`` also each one's summed log-probability (EOS included).

        lp = ((5 + length) / 6) ** length_penalty (GNMT).  Finished hypotheses stay in their beam
        slot with a frozen score (they can only extend with EOS at zero cost), so each source's
        search depends only on its own beams: batching cannot change the result.
        """
        if not 1 <= beam_size < self.output_size:
            raise ValueError(f"beam_size must be in [1, output vocabulary size "
                             f"{self.output_size}), got {beam_size}")
        src_ids, src_len = _as_tensor(src_ids), _as_tensor(src_len)
        batch, k, vocab = int(src_ids.shape[0]), beam_size, self.output_size
        memory = self.encode(src_ids, src_len)
        # every tensor from here is [B * k, ...], the k beams of a source adjacent
        src_len_k = paddle.repeat_interleave(src_len, k, axis=0)
        limits = self.length_limits(src_len_k, max_len)
        self_k, self_v, cross_k, cross_v = self.init_cache(paddle.repeat_interleave(memory, k, 0))
        tokens = paddle.full([batch * k, 1], self.bos_id, dtype="int64")
        # only beam 0 is alive at the start, or the k beams would be k copies of one hypothesis
        scores = paddle.to_tensor([0.0] + [-1e30] * (k - 1), dtype="float32").tile([batch])
        finished = paddle.zeros([batch * k], dtype="bool")
        lengths = paddle.zeros([batch * k], dtype="int64")
        eos_only = paddle.full([vocab], -1e30, dtype="float32")
        eos_only[self.eos_id] = 0.0
        for t in range(int(limits.max())):
            logp, self_k, self_v = self.decode_step(tokens[:, -1:], src_len_k, self_k, self_v,
                                                    cross_k, cross_v)
            # finished beams and beams at their limit may only emit EOS (at zero cost if finished)
            forced = paddle.logical_or(finished, limits <= t + 1).unsqueeze(1)
            step_logp = paddle.where(finished.unsqueeze(1), eos_only.unsqueeze(0), logp)
            step_logp = paddle.where(forced, step_logp + eos_only.unsqueeze(0), step_logp)
            total = (scores.unsqueeze(1) + step_logp).reshape([batch, k * vocab])
            scores, flat = paddle.topk(total, k, axis=1)
            beam = flat // vocab + paddle.arange(batch, dtype="int64").unsqueeze(1) * k
            beam, nxt = beam.reshape([-1]), (flat % vocab).reshape([-1])
            scores = scores.reshape([-1])
            was_finished = paddle.gather(finished, beam)
            tokens = paddle.concat([paddle.gather(tokens, beam), nxt.unsqueeze(1)], axis=1)
            still_going = paddle.logical_not(was_finished).astype("int64")
            lengths = paddle.gather(lengths, beam) + still_going
            finished = paddle.logical_or(was_finished, nxt == self.eos_id)
            self_k = paddle.gather(self_k, beam, axis=1)
            self_v = paddle.gather(self_v, beam, axis=1)
            if bool(finished.all()):
                break
        penalty = ((5.0 + lengths.astype("float32")) / 6.0) ** length_penalty
        best = (scores / penalty).reshape([batch, k]).argmax(axis=1)
        rows = best + paddle.arange(batch, dtype="int64") * k
        hyps = self._strip(paddle.gather(tokens[:, 1:], rows).numpy().tolist())
        return (hyps, paddle.gather(scores, rows).numpy().tolist()) if return_scores else hyps


class EncoderProgram(nn.Layer):
    """Export view: (src_ids, src_len) -> (cross_k, cross_v), the memory as the decoder needs it."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, src_ids, src_len):
        _, _, cross_k, cross_v = self.model.init_cache(self.model.encode(src_ids, src_len))
        return cross_k, cross_v

    @staticmethod
    def input_spec():
        return [InputSpec([None, None], "int64", "src_ids"), InputSpec([None], "int64", "src_len")]


class DecoderStepProgram(nn.Layer):
    """Export view of ``decode_step``: the search loop (greedy / beam) runs outside the graph."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens, src_len, self_k, self_v, cross_k, cross_v):
        return self.model.decode_step(tokens, src_len, self_k, self_v, cross_k, cross_v)

    def input_spec(self):
        layers, heads = len(self.model.decoder.layers), self.model.num_heads
        cache = [InputSpec([layers, None, heads, None, self.model.head_dim], "float32", name)
                 for name in ("self_k", "self_v", "cross_k", "cross_v")]
        tokens = InputSpec([None, 1], "int64", "tokens")
        return [tokens, InputSpec([None], "int64", "src_len")] + cache


def _drop_ended(ended, per_row, caches):
    """The rows not ``ended`` of each ``per_row`` tensor [B, ...] and each cache [L, B, ...]."""
    keep = paddle.nonzero(paddle.logical_not(ended)).squeeze(1)
    return ([paddle.gather(t, keep) for t in per_row],
            [paddle.gather(t, keep, axis=1) for t in caches])


class GreedyProgram(nn.Layer):
    """Export view of ``greedy_decode`` with the loop IN the graph: (src_ids, src_len) -> tokens.

    ``tokens`` [B, T] int64 are the generated ids after BOS: each row ends with its EOS (forced
    at the row's limit) and holds ``pad_id`` after it; T is the longest row, because the loop
    stops as soon as every row has finished.  to_static turns the tensor-conditioned ``while``
    into one PIR while op whose carried tokens and self-attention cache grow by a step per
    iteration; Paddle 3.3.1 Inference runs that with oneDNN on and off (tests/test_export_seq2seq).

    A finished row leaves the decoding batch: after a step in which rows ended, the next
    iteration gathers the rows still decoding (caches, source lengths, limits, last tokens; a
    cond op, so a step after which no row ended copies nothing) and steps only those; their
    tokens are scattered into the full-batch column (``pad_id`` for the rows that left).  A
    row's computation does not depend on the other rows, so the tokens are the full batch's.
    ``shrink=False`` steps every row to the end (the reference for tests and benchmarks).
    """

    def __init__(self, model, shrink=True):
        super().__init__()
        self.model = model
        self.shrink = shrink

    def forward(self, src_ids, src_len):
        return self.decode(src_ids, src_len)[0]

    def decode(self, src_ids, src_len):
        """(tokens [B, T], row_steps): row_steps counts the decoder's row-steps (rows stepped,
        summed over the steps), what leaving the batch saves."""
        m = self.model
        memory = m.encode(src_ids, src_len)
        self_k, self_v, cross_k, cross_v = m.init_cache(memory)
        limits = m.length_limits(src_len)
        batch = paddle.shape(src_ids)[0]
        tokens = paddle.full([batch, 1], m.bos_id, dtype="int64")
        pad = paddle.full([batch], m.pad_id, dtype="int64")
        # the rows in the decoding batch: their source row, last token, and whether it ended
        rows = paddle.arange(batch, dtype="int64")
        last = paddle.full([batch], m.bos_id, dtype="int64")
        ended = paddle.zeros([batch], dtype="bool")
        steps, max_steps = paddle.zeros([], dtype="int64"), limits.max()
        row_steps = paddle.zeros([], dtype="int64")
        going = steps < max_steps
        while going:
            if self.shrink:  # Python-level: traced once
                if ended.any():  # a cond op: gather only after a row ended
                    (rows, last, src_len, limits), (self_k, self_v, cross_k, cross_v) = \
                        _drop_ended(ended, (rows, last, src_len, limits),
                                    (self_k, self_v, cross_k, cross_v))
                    ended = paddle.zeros_like(rows).astype("bool")
            logp, self_k, self_v = m.decode_step(last.unsqueeze(1), src_len, self_k, self_v,
                                                 cross_k, cross_v)
            steps = steps + 1
            row_steps = row_steps + paddle.shape(last)[0].astype("int64")
            nxt = logp.argmax(axis=-1)
            nxt = paddle.where(limits <= steps, paddle.full_like(nxt, m.eos_id), nxt)
            nxt = paddle.where(ended, paddle.full_like(nxt, m.pad_id), nxt)  # none if shrunk
            tokens = paddle.concat([tokens, paddle.scatter(pad, rows, nxt).unsqueeze(1)], axis=1)
            ended = paddle.logical_or(ended, nxt == m.eos_id)
            last = nxt
            going = paddle.logical_and(steps < max_steps, paddle.logical_not(ended.all()))
        return tokens[:, 1:], row_steps

    @staticmethod
    def input_spec():
        return EncoderProgram.input_spec()


def build_seq2seq(model_cfg, vocab_size, pad_id=0, bos_id=4, eos_id=5, label_smoothing=0.0,
                  output_size=None):
    """The registry's entry for ``Model.name: seq2seq`` (special ids per docs/DESIGN.md)."""
    if model_cfg.max_len_a < 0 or model_cfg.max_len_b < 1:
        raise ValueError(f"Model.max_len_a ({model_cfg.max_len_a}) must be >= 0 and "
                         f"Model.max_len_b ({model_cfg.max_len_b}) >= 1: every output needs "
                         f"room for at least its EOS")
    return Seq2SeqTransformer(
        vocab_size, hidden_size=model_cfg.hidden_size, num_heads=model_cfg.num_heads,
        ffn_size=model_cfg.ffn_size, num_layers=model_cfg.num_layers,
        num_decoder_layers=model_cfg.num_decoder_layers, dropout=model_cfg.dropout,
        max_position=model_cfg.max_position, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id,
        label_smoothing=label_smoothing, max_len_a=model_cfg.max_len_a,
        max_len_b=model_cfg.max_len_b, output_size=output_size)


def build(cfg, vocab_size, num_labels, pad_id, init_weights=True):
    """The registered builder (ppvarlen/model_registry.py); ``num_labels`` = the output
    vocabulary (ids < num_labels can be generated), 0 = all ids."""
    return build_seq2seq(Config(cfg), vocab_size, pad_id=pad_id, output_size=num_labels or None)
