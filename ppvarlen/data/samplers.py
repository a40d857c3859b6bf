"""Length-aware batch samplers (``paddle.io.BatchSampler`` subclasses yielding index lists).

* ``TokenBudgetBatchSampler`` — batches whose padded cost (size x longest)
  stays within ``max_tokens``; lengths are sorted only within shuffled pools of
  ``pool_size`` batches (``pool_size <= 0``: one pool = the whole split, i.e.
  fairseq's shuffle -> stable sort -> pack -> shuffle batches).
* ``BucketBatchSampler`` — static length buckets; per-bucket batch size fixed or
  derived from a token budget; pads to the batch max or the bucket boundary.

Shared behaviour (``_LengthBatchSampler``): batches are a pure function of
(seed, epoch); every example appears exactly once per epoch; with
``num_replicas`` > 1 every rank yields the SAME number of batches (the global
batch list is padded by repeating batches from its start, counted in
``num_repeated_batches`` / ``num_repeated_examples``); ``state_dict`` /
``load_state_dict`` resume mid-epoch exactly.

Planning an epoch is O(N log N) numpy work (one sort) plus one small step per batch;
an epoch's batches are kept as ONE index array cut by (start, stop) offsets
(``_Batches``), turned into Python lists only when a batch is handed out.
"""
import heapq

import numpy as np
from paddle.io import BatchSampler

from ..config import ConfigError
from ..utils.log import get_logger
from .errors import DataError
from .lengths import bucket_index, optimal_boundaries, quantile_boundaries
from .order import budget_cuts, sorted_batch_count

log = get_logger("data.samplers")


def _check_lengths(lengths):
    """The lengths as given (any integer dtype, memory-mapped or not: never copied)."""
    arr = np.asarray(lengths)
    if arr.ndim not in (1, 2) or arr.shape[0] == 0:
        raise ValueError(f"lengths must be a non-empty [n] or [n, k] array, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer) or arr.min() < 1:
        raise ValueError("lengths must be positive integers (drop empty examples before batching)")
    return arr


def _narrow(key):
    """``key`` (non-negative) as the narrowest signed type holding it: numpy's stable sort is
    a radix sort for 16-bit keys (same order, several times faster), and an epoch's gathers
    of the keys move a quarter of the bytes of int64 ones; signed, so differences of
    neighbours stay exact (``order.budget_cuts`` reads them)."""
    top = int(key.max()) if len(key) else 0
    for dtype in (np.int16, np.int32):
        if top <= np.iinfo(dtype).max:
            return key.astype(dtype, copy=False)
    return key


def _stable_order(key, step):
    """Indices sorting ``key`` (``_narrow``ed) stably within consecutive pools of ``step``
    (the last one shorter): one batched sort of the full pools."""
    n = len(key)
    full = n // step * step if step < n else 0
    order = np.empty(n, dtype=np.int64)
    if full:
        pools = np.argsort(key[:full].reshape(-1, step), axis=1, kind="stable")
        pools += np.arange(0, full, step, dtype=np.int64)[:, None]
        order[:full] = pools.reshape(-1)
    order[full:] = np.argsort(key[full:], kind="stable") + full
    return order


class _Batches:
    """Batch b of an epoch = ``order[starts[b]:stops[b]]`` (one shared index array)."""

    def __init__(self, order, starts, stops):
        self.order, self.starts, self.stops = order, starts, stops

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, b):
        return self.order[self.starts[b]:self.stops[b]].tolist()

    def sizes(self):
        return self.stops - self.starts

    def take(self, picks):
        """The batches ``picks`` (indices into this list), in that order."""
        return _Batches(self.order, self.starts[picks], self.stops[picks])

    def lists(self):
        flat = self.order.tolist() if len(self.order) else []
        return [flat[a:b] for a, b in zip(self.starts.tolist(), self.stops.tolist())]


def _check_oversize(key, max_tokens, policy):
    if policy not in ("own_batch", "error"):
        raise ValueError(f"Data.oversize must be own_batch or error, got {policy!r}")
    over = np.flatnonzero(key > max_tokens)
    if over.size and policy == "error":
        show = ", ".join(f"#{int(i)} ({int(key[i])} tokens)" for i in over[:5])
        raise DataError(f"{over.size} example(s) are longer than Data.max_tokens={max_tokens}: "
                        f"{show}{' ...' if over.size > 5 else ''}. Raise Data.max_tokens, lower "
                        f"Data.max_len, or set Data.oversize: own_batch")
    if over.size:
        log.warning("%d example(s) longer than max_tokens=%d get a batch of their own",
                    over.size, max_tokens)
    return int(over.size)


class _LengthBatchSampler(BatchSampler):
    """Epoch bookkeeping, sharding and resume shared by the samplers."""

    def __init__(self, lengths, shuffle, seed, num_replicas, rank):
        # Paddle's BatchSampler.__init__ wants a dataset/sampler to draw indices
        # from; ours come from the lengths, so it is deliberately not called.
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"need 0 <= rank < num_replicas, got rank={rank}, "
                             f"num_replicas={num_replicas}")
        self.lengths = _check_lengths(lengths)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.epoch = 0
        self.drop_last = False  # read by some Paddle utilities; we never drop
        self._skip = 0          # batches to skip at the next __iter__ (resume)
        self._yielded = 0       # batches handed out in the current pass
        self._cache = None      # (epoch, this rank's batches)
        self.num_repeated_batches = 0
        self.num_repeated_examples = 0

    # ---------------------------------------------------------------- subclass hook
    def _global_batches(self, rng):
        """All batches of one epoch, for all ranks, as ``_Batches``; ``rng`` is None when
        not shuffling."""
        raise NotImplementedError

    # ---------------------------------------------------------------- epoch
    def _rank_batches(self):
        """This rank's ``_Batches`` of the current epoch (planned once per epoch)."""
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1]
        batches = self._global_batches(self._epoch_rng(self.epoch))
        total = len(batches)
        pad = -total % self.num_replicas
        # the global list padded by repeating batches from its start, dealt round-robin
        picks = np.arange(total + pad) % total
        self.num_repeated_batches = pad
        self.num_repeated_examples = int(batches.sizes()[picks[total:]].sum())
        mine = batches.take(picks[self.rank::self.num_replicas])
        self._cache = (self.epoch, mine)
        return mine

    def _epoch_rng(self, epoch):
        """The random stream of one epoch (None when not shuffling): batches are a pure
        function of (seed, epoch)."""
        return np.random.default_rng([self.seed, int(epoch)]) if self.shuffle else None

    def set_epoch(self, epoch):
        """Select the epoch (reshuffles); a pending resume position is kept only for its epoch."""
        epoch = int(epoch)
        if epoch != self.epoch:
            self._skip = self._yielded = 0
        self.epoch = epoch

    def __iter__(self):
        # not a generator itself: the resume position is taken when iter() is called
        batches = self._rank_batches()
        self._yielded, self._skip = self._skip, 0
        return self._generate(batches, self._yielded)

    def _generate(self, batches, start):
        for b in range(start, len(batches)):
            self._yielded += 1
            yield batches[b]

    def __len__(self):
        """Batches the next ``__iter__`` yields on this rank (full epoch unless resuming)."""
        return len(self._rank_batches()) - self._skip

    @property
    def batch_size(self):
        """Largest batch this rank yields this epoch.  Paddle and PaddleNLP code reads
        ``batch_sampler.batch_size`` (e.g. ``Trainer.evaluation_loop``); ours varies per
        batch, so this is the upper bound, never a per-batch promise."""
        return int(self._rank_batches().sizes().max())

    def epoch_batches(self):
        """This rank's full batch list for the current epoch (analysis and tests)."""
        return self._rank_batches().lists()

    # ---------------------------------------------------------------- resume
    def state_dict(self, batches_consumed=None):
        """Position in the epoch.  A ``paddle.io.DataLoader`` prefetches batches from
        the sampler, so the trainer passes the number of batches it has actually
        consumed this epoch; the default (batches handed out) is exact only when
        iterating the sampler directly."""
        done = self._yielded if batches_consumed is None else int(batches_consumed)
        return {"epoch": self.epoch, "seed": self.seed, "batches_yielded": done,
                "num_replicas": self.num_replicas, "rank": self.rank,
                "num_examples": int(self.lengths.shape[0])}

    def load_state_dict(self, state):
        for key, mine in (("num_examples", int(self.lengths.shape[0])),
                          ("num_replicas", self.num_replicas)):
            if key in state and int(state[key]) != mine:
                raise ValueError(f"cannot resume the sampler: saved {key}={state[key]} but now "
                                 f"{mine}; resume with the same data and number of devices, or "
                                 f"start a fresh run")
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self._cache = None
        total = len(self._rank_batches())
        done = int(state["batches_yielded"])
        if not 0 <= done <= total:
            raise ValueError(f"cannot resume the sampler: batches_yielded={done} but epoch "
                             f"{self.epoch} has {total} batches on this rank")
        self._skip = done


class TokenBudgetBatchSampler(_LengthBatchSampler):
    """Batches with size x longest <= ``max_tokens`` (padding counted).

    Shuffled: permute, cut into pools of about ``pool_size`` batches, sort each
    pool by length, pack by budget, shuffle all batches.  ``pool_size <= 0``
    sorts the whole split (fairseq style: most efficient, randomness only from
    tie-breaks and batch order).  Not shuffled: global stable sort, no
    randomness (eval).  ``lengths`` may be [n, 2] (source, target) for seq2seq:
    the cost is then size x (max_src + max_tgt).

    ``num_batches``: every epoch yields exactly this many (global) batches, for
    loops that fix the steps per epoch once (PaddleNLP's Trainer).  Pooled
    packing gives a slightly different count each epoch; an epoch with fewer
    batches has its largest batches halved until the count is reached (halves
    stay within the budget); an epoch with more is an error.  ``batch_counts``
    gives the natural count of any epochs, to choose it.
    """

    def __init__(self, lengths, max_tokens, shuffle=True, pool_size=100, max_sentences=None,
                 batch_size_multiple=1, oversize="own_batch", seed=0, num_replicas=1, rank=0,
                 num_batches=None):
        super().__init__(lengths, shuffle, seed, num_replicas, rank)
        self.num_batches = None if num_batches is None else int(num_batches)
        if self.num_batches is not None and int(batch_size_multiple) > 1:
            raise ValueError("num_batches halves batches, which breaks batch_size_multiple; "
                             "use one of them")
        self.max_tokens = int(max_tokens)
        self.pool_size = int(pool_size or 0)
        self.max_sentences = max_sentences
        self.batch_size_multiple = int(batch_size_multiple)
        # the sort / oversize key: the row sum for [n, k] lengths
        key = self.lengths if self.lengths.ndim == 1 else self.lengths.sum(axis=1, dtype=np.int64)
        self._key = _narrow(key)
        self.num_oversize = _check_oversize(self._key, self.max_tokens, oversize)
        self._sorted = None  # the unshuffled epoch, packed when first asked for
        # pool_size counts batches; convert to examples with the sorted packing's mean batch size
        self.pool_examples = max(1, round(self.pool_size * len(self._key) /
                                          self._sorted_count()))
        self._packed = None   # ((seed, epoch), natural batches) of the last epoch packed
        self._counts = {}     # (seed, epoch) -> natural batch count (batch_counts)

    def _sorted_count(self):
        """Batches of the unshuffled epoch: from the lengths' histogram for [n] lengths (no
        sort), by packing the sorted split for [n, 2] (their cost is not the row sum's)."""
        if self.lengths.ndim == 1:
            return sorted_batch_count(self.lengths, self.max_tokens, self.max_sentences,
                                      self.batch_size_multiple)
        self._sorted = self._pack(_stable_order(self._key, len(self._key)))
        return len(self._sorted)

    def _pack(self, order, pool=None, rows=None):
        """``_Batches`` of ``order`` packed by budget, runs of ``pool`` examples apart
        (``rows``: ``self.lengths[order]`` when the caller has them)."""
        n = len(order)
        rows = self.lengths[order] if rows is None else rows
        runs = None if pool is None or pool >= n else np.append(np.arange(pool, n, pool), n)
        ends = budget_cuts(rows, self.max_tokens, self.max_sentences, self.batch_size_multiple,
                           runs)
        return _Batches(order, np.concatenate([[0], ends[:-1]]).astype(np.int64), ends)

    def _global_batches(self, rng):
        batches = self._packed_batches(rng)
        return batches if self.num_batches is None else self._to_count(batches)

    def batch_counts(self, epochs):
        """Natural (global) batch count of each epoch in ``epochs``, ignoring ``num_batches``
        (each epoch is packed once; its count is kept)."""
        epochs = [int(e) for e in epochs]
        for epoch in epochs:
            if (self.seed, epoch) not in self._counts:
                self._packed_batches(self._epoch_rng(epoch), epoch)
        return [self._counts[self.seed, epoch] for epoch in epochs]

    def _to_count(self, batches):
        """Halve the batch with the most examples (the first one on ties) until there are
        ``num_batches``.  Only the ``missing`` largest batches can be halved, so a heap over
        them, keyed by (-size, batch, offset), replays the list-order tie-break exactly."""
        if len(batches) > self.num_batches:
            raise DataError(f"num_batches={self.num_batches} but epoch {self.epoch} packs into "
                            f"{len(batches)} batches of max_tokens={self.max_tokens}; set "
                            f"num_batches >= max(batch_counts(epochs))")
        missing = self.num_batches - len(batches)
        if missing == 0:
            return batches
        sizes = batches.sizes()
        largest = np.lexsort((np.arange(len(sizes)), -sizes))[:missing]
        heap = [(-int(sizes[b]), int(b), int(batches.starts[b]), int(batches.stops[b]))
                for b in largest]
        heapq.heapify(heap)
        for _ in range(missing):
            size, b, start, stop = heapq.heappop(heap)
            if -size < 2:
                raise DataError(f"num_batches={self.num_batches} is more than the "
                                f"{len(self.lengths)} examples")
            mid = start + (-size) // 2
            heapq.heappush(heap, (start - mid, b, start, mid))
            heapq.heappush(heap, (mid - stop, b, mid, stop))
        # (batch, start, stop) of the pieces; each batch's pieces take its place, by their start
        pieces = np.asarray([piece[1:] for piece in heap], dtype=np.int64)
        whole = np.setdiff1d(np.arange(len(sizes)), pieces[:, 0])
        which = np.concatenate([whole, pieces[:, 0]])
        starts = np.concatenate([batches.starts[whole], pieces[:, 1]])
        stops = np.concatenate([batches.stops[whole], pieces[:, 2]])
        at = np.lexsort((starts, which))
        return _Batches(batches.order, starts[at], stops[at])

    def _packed_batches(self, rng, epoch=None):
        """The natural batches of an epoch: shuffle, sort within pools, pack, shuffle batches."""
        epoch = self.epoch if epoch is None else epoch
        if rng is None:
            if self._sorted is None:
                self._sorted = self._pack(_stable_order(self._key, len(self._key)))
            self._counts[self.seed, epoch] = len(self._sorted)
            return self._sorted
        if self._packed is not None and self._packed[0] == (self.seed, epoch):
            return self._packed[1]
        n = len(self._key)
        perm = rng.permutation(n)
        step = n if self.pool_size <= 0 else self.pool_examples
        # a stable sort of each pool keeps the random order among equal lengths
        keyed = self._key[perm]
        within = _stable_order(keyed, step)
        order = perm[within]
        # [n] lengths: the rows in packing order are the pool-sorted keys (a gather within each
        # pool, not a second one across the whole split)
        batches = self._pack(order, step, keyed[within] if self.lengths.ndim == 1 else None)
        batches = batches.take(rng.permutation(len(batches)))
        self._packed = ((self.seed, epoch), batches)
        self._counts[self.seed, epoch] = len(batches)
        return batches


class BucketBatchSampler(_LengthBatchSampler):
    """Static buckets: example -> the smallest boundary >= its length.

    Per-bucket batch size: ``batch_size`` (fixed) or, with ``max_tokens``,
    ``max_tokens // boundary`` so every bucket's batch costs about the same
    memory (capped by ``max_sentences``, rounded down to ``batch_size_multiple``).
    ``pad_length(batch)`` gives the length the collator should pad the batch to:
    the bucket boundary with ``pad_to_bucket`` (fixed shapes), else the batch max.
    """

    def __init__(self, lengths, boundaries, batch_size=None, max_tokens=None, shuffle=True,
                 pad_to_bucket=False, max_sentences=None, batch_size_multiple=1,
                 oversize="own_batch", seed=0, num_replicas=1, rank=0):
        super().__init__(lengths, shuffle, seed, num_replicas, rank)
        if self.lengths.ndim != 1:
            raise ValueError("BucketBatchSampler needs 1-D lengths")
        if (batch_size is None) == (max_tokens is None):
            raise ValueError("BucketBatchSampler: give exactly one of batch_size or max_tokens")
        bounds = [int(b) for b in boundaries]
        if not bounds or bounds != sorted(set(bounds)) or bounds[0] < 1:
            raise ValueError(f"bucket boundaries must be strictly increasing positive ints, "
                             f"got {list(boundaries)}")
        self.boundaries = np.asarray(bounds, dtype=np.int64)
        self.bucket_of = bucket_index(self.lengths, self.boundaries)  # raises if over the last
        self.pad_to_bucket = bool(pad_to_bucket)
        self.num_oversize = 0
        if max_tokens is not None:
            self.num_oversize = _check_oversize(self.lengths, int(max_tokens), oversize)
            sizes = np.maximum(1, int(max_tokens) // self.boundaries)
            if max_sentences:
                sizes = np.minimum(sizes, int(max_sentences))
            m = int(batch_size_multiple)
            sizes = np.where(sizes > m, sizes - sizes % m, sizes)
        else:
            if int(batch_size) < 1:
                raise ValueError(f"batch_size must be >= 1, got {batch_size}")
            sizes = np.full(len(bounds), int(batch_size))
        self.bucket_batch_sizes = [int(s) for s in sizes]

    def _global_batches(self, rng):
        # members of every bucket in index order, buckets one after the other
        order = np.argsort(self.bucket_of, kind="stable")
        ends = np.cumsum(np.bincount(self.bucket_of, minlength=len(self.bucket_batch_sizes)))
        starts, stops, begin = [], [], 0
        for end, size in zip(ends.tolist(), self.bucket_batch_sizes):
            if rng is not None:
                order[begin:end] = rng.permutation(order[begin:end])
            first = np.arange(begin, end, size, dtype=np.int64)
            starts.append(first)
            stops.append(np.minimum(first + size, end))
            begin = end
        batches = _Batches(order, np.concatenate(starts), np.concatenate(stops))
        if rng is not None:
            batches = batches.take(rng.permutation(len(batches)))
        return batches

    def pad_length(self, batch):
        longest = int(self.lengths[np.asarray(batch)].max())
        return int(self.boundaries[bucket_index([longest], self.boundaries)[0]]) \
            if self.pad_to_bucket else longest


def build_batch_sampler(dataset, data_cfg, shuffle, num_replicas=1, rank=0, seed=0):
    """The batch sampler ``Data.sampler`` names, over ``dataset.lengths``.

    token_budget: ``TokenBudgetBatchSampler(max_tokens, pool_size, ...)``; seq2seq
    datasets (with ``src_lengths``/``tgt_lengths``) are budgeted on source AND
    target padding.  bucket: ``BucketBatchSampler`` with ``Data.buckets`` or
    boundaries computed by ``Data.bucket_method`` (``num_buckets``), per-bucket
    sizes from ``max_tokens`` (``max_tokens: null``: fixed ``batch_size``).  random: shuffled fixed ``batch_size`` batches
    with dynamic padding (one bucket spanning all lengths).
    Eval (``shuffle=False``) always uses the deterministic length-sorted order
    for token_budget, bucket order for the others.
    """
    lengths = np.asarray(dataset.lengths)  # any integer dtype, memory-mapped too: not copied
    if not np.issubdtype(lengths.dtype, np.integer):
        lengths = lengths.astype(np.int64)
    kind = data_cfg.sampler
    common = dict(shuffle=shuffle, seed=seed, num_replicas=num_replicas, rank=rank)
    if kind == "token_budget":
        if data_cfg.max_tokens is None:
            raise ConfigError("Data.max_tokens: sampler token_budget needs a token budget "
                              "(e.g. 4096); null is only for sampler: bucket / random")
        cost = lengths
        if getattr(dataset, "src_lengths", None) is not None:
            cost = np.stack([dataset.src_lengths, dataset.tgt_lengths], axis=1)
        return TokenBudgetBatchSampler(cost, data_cfg.max_tokens, pool_size=data_cfg.pool_size,
                                       max_sentences=data_cfg.max_sentences,
                                       batch_size_multiple=data_cfg.batch_size_multiple,
                                       oversize=data_cfg.oversize, **common)
    if kind == "bucket":
        bounds = data_cfg.buckets
        if not bounds:
            pick = optimal_boundaries if data_cfg.bucket_method == "optimal" else \
                lambda ls, k, m: quantile_boundaries(ls, pad_to_multiple_of=m)
            bounds = pick(lengths, data_cfg.num_buckets, data_cfg.pad_to_multiple_of)
        bounds = sorted(set(int(b) for b in bounds))
        if bounds[-1] < lengths.max():
            raise DataError(f"Data.buckets={bounds}: {int((lengths > bounds[-1]).sum())} examples "
                            f"are longer than the last boundary (longest {int(lengths.max())}); "
                            f"add a boundary >= {int(lengths.max())} or lower Data.max_len")
        budget = {"max_tokens": data_cfg.max_tokens} if data_cfg.max_tokens is not None \
            else {"batch_size": data_cfg.batch_size}
        return BucketBatchSampler(lengths, bounds, **budget, pad_to_bucket=data_cfg.pad_to_bucket,
                                  max_sentences=data_cfg.max_sentences,
                                  batch_size_multiple=data_cfg.batch_size_multiple,
                                  oversize=data_cfg.oversize, **common)
    if kind == "random":
        return BucketBatchSampler(lengths, [int(lengths.max())], batch_size=data_cfg.batch_size,
                                  **common)
    raise ValueError(f"Data.sampler must be token_budget, bucket or random, got {kind!r}")
