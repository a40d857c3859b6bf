"""The samplers give the SAME batches as the original (per-pool, all-Python) implementation.

``_old_*`` below is a verbatim copy of the packing, pooling, fixed-count halving, bucket
batching and rank split of ``data/order.py`` / ``data/samplers.py`` before they were
rewritten for O(N log N) planning (git history: commit 33c26aa).  It is slow (O(N x pools))
and serves only as the reference oracle here.  ``FINGERPRINTS`` were recorded from the
unchanged sampler classes on the shipped configs' sampler settings, so the rewrite is held
to the old batches twice: batch-for-batch against the oracle on random inputs, and by hash
on the shipped settings.
"""
import hashlib
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppvarlen.config import load_config
from ppvarlen.data.order import length_sorted_batches, pack_by_budget, sorted_batch_count
from ppvarlen.data.samplers import (BucketBatchSampler, TokenBudgetBatchSampler,
                                    build_batch_sampler)


# ---------------------------------------------------------------- the original implementation
def _old_pack_by_budget(order, lengths, max_tokens, max_batch_size=None, batch_size_multiple=1):
    cap = max_batch_size or len(order) + 1
    rows = np.asarray(lengths, dtype=np.int64)
    rows = (rows.reshape(-1, 1) if rows.ndim == 1 else rows).tolist()

    def widest(indices):
        if not indices:
            return [0] * len(rows[0])
        return [max(col) for col in zip(*(rows[i] for i in indices))]

    batches, cur = [], []
    cur_max = widest(cur) if rows else []
    for idx in order:
        idx = int(idx)
        new_max = [max(a, b) for a, b in zip(cur_max, rows[idx])]
        while cur and (len(cur) + 1 > cap or (len(cur) + 1) * sum(new_max) > max_tokens):
            keep = len(cur)
            if batch_size_multiple > 1 and keep > batch_size_multiple:
                keep -= keep % batch_size_multiple
            batches.append(cur[:keep])
            cur = cur[keep:]
            cur_max = widest(cur)
            new_max = [max(a, b) for a, b in zip(cur_max, rows[idx])]
        cur.append(idx)
        cur_max = new_max
    if cur:
        batches.append(cur)
    return batches


def _old_rng(seed, epoch, shuffle):
    return np.random.default_rng([seed, int(epoch)]) if shuffle else None


def _old_token_budget_natural(lengths, max_tokens, shuffle, pool_size, max_sentences, multiple,
                              seed, epoch):
    lengths = np.asarray(lengths, dtype=np.int64)
    key = lengths if lengths.ndim == 1 else lengths.sum(axis=1)

    def pack(order):
        return _old_pack_by_budget(order, lengths, max_tokens, max_sentences, multiple)

    pool_size = int(pool_size or 0)
    sorted_batches = pack(np.argsort(key, kind="stable"))
    pool_examples = max(1, round(pool_size * len(key) / len(sorted_batches)))
    rng = _old_rng(seed, epoch, shuffle)
    if rng is None:
        return sorted_batches
    perm = rng.permutation(len(key))
    step = len(perm) if pool_size <= 0 else pool_examples
    batches = []
    for start in range(0, len(perm), step):
        pool = perm[start:start + step]
        batches += pack(pool[np.argsort(key[pool], kind="stable")])
    return [batches[i] for i in rng.permutation(len(batches))]


def _old_to_count(batches, num_batches):
    assert len(batches) <= num_batches
    batches = list(batches)
    while len(batches) < num_batches:
        i = max(range(len(batches)), key=lambda j: len(batches[j]))
        assert len(batches[i]) >= 2
        half = len(batches[i]) // 2
        batches[i:i + 1] = [batches[i][:half], batches[i][half:]]
    return batches


def _old_bucket_batches(bucket_of, sizes, rng):
    batches = []
    for k, size in enumerate(sizes):
        members = np.flatnonzero(bucket_of == k)
        if rng is not None:
            members = rng.permutation(members)
        batches += [members[i:i + size].tolist() for i in range(0, len(members), size)]
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def _old_rank_split(batches, num_replicas, rank):
    pad = -len(batches) % num_replicas
    extra = [batches[i % len(batches)] for i in range(pad)]
    return (batches + extra)[rank::num_replicas], pad, sum(len(b) for b in extra)


# ---------------------------------------------------------------- helpers
PROPS = settings(max_examples=40, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fingerprint(batch_lists):
    text = json.dumps([[int(i) for i in b] for b in batch_lists], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def synthetic_lengths(n=3000, seed=20261202):
    """Deterministic lengths like the shipped corpora's: 1-D lognormal reviews capped at 256,
    and [n, 2] g2p (source <= 16 chars, target <= 96 tokens)."""
    rng = np.random.default_rng(seed)
    one = np.clip(np.round(rng.lognormal(4.0, 0.8, n)), 1, 256).astype(np.int64)
    src = rng.integers(1, 17, n)
    two = np.stack([src, np.clip(src * 3 + rng.integers(-4, 12, n), 1, 96)], axis=1)
    return one, two


# shipped configs' Data sections (configs/*/*.yaml) as (lengths kind, Data overrides)
SHIPPED = {
    # also ner/bigru_crf.yaml: max_tokens 4096 with the schema default pool_size (200)
    "sentiment_transformer": ("1d", {"max_tokens": 4096, "pool_size": 200}),
    "sentiment_pretrain_mlm": ("1d", {"max_tokens": 2048, "pool_size": 200}),
    "g2p_transformer": ("2d", {"max_tokens": 2048, "pool_size": 100}),
    "bucket_optimal_default": ("1d", {"sampler": "bucket"}),
    "random_default": ("1d", {"sampler": "random"}),
}


class _Dataset:
    def __init__(self, lengths):
        if lengths.ndim == 2:
            self.src_lengths, self.tgt_lengths = lengths[:, 0], lengths[:, 1]
            self.lengths = lengths.sum(axis=1)
        else:
            self.lengths = lengths


def shipped_batches(name):
    """{label: batch lists} for one shipped setting: 2 epochs x (1 rank, 2 ranks), shuffled,
    plus the eval (unshuffled) batches at eval_max_tokens and the PaddleNLP fixed count."""
    kind, overrides = SHIPPED[name]
    one, two = synthetic_lengths()
    ds = _Dataset(one if kind == "1d" else two)
    data_cfg = load_config(data={"Data": overrides}).Data
    out = {}
    for world in (1, 2):
        for rank in range(world):
            s = build_batch_sampler(ds, data_cfg, shuffle=True, num_replicas=world, rank=rank,
                                    seed=42)
            for epoch in (0, 1):
                s.set_epoch(epoch)
                out[f"train/w{world}/r{rank}/e{epoch}"] = s.epoch_batches()
    ev = build_batch_sampler(ds, data_cfg, shuffle=False)
    out["eval"] = ev.epoch_batches()
    if data_cfg.sampler == "token_budget":
        cost = one if kind == "1d" else two
        s = TokenBudgetBatchSampler(cost, data_cfg.eval_max_tokens, shuffle=False)
        out["eval_budget"] = s.epoch_batches()
        s = TokenBudgetBatchSampler(cost, data_cfg.max_tokens, pool_size=data_cfg.pool_size,
                                    seed=42)
        s.num_batches = max(s.batch_counts(range(3))) + 3
        for epoch in (0, 1):
            s.set_epoch(epoch)
            out[f"fixed_count/e{epoch}"] = s.epoch_batches()
    return out


# recorded from the unchanged implementation (commit 33c26aa) with shipped_batches()
FINGERPRINTS = {
    "sentiment_transformer": {
        "train/w1/r0/e0": "b1f3d48c50464599",
        "train/w1/r0/e1": "b718324b96a08d60",
        "train/w2/r0/e0": "01bcdeb71a1719ce",
        "train/w2/r0/e1": "7bd585d2d2033d42",
        "train/w2/r1/e0": "08c1a972773d8af1",
        "train/w2/r1/e1": "67ed4d7dc819cb1e",
        "eval": "c6279ca2fea590f7",
        "eval_budget": "6c75d632cd136577",
        "fixed_count/e0": "e77d3f4f918c854c",
        "fixed_count/e1": "1f22eb932c3ccf5b",
    },
    "sentiment_pretrain_mlm": {
        "train/w1/r0/e0": "b9711f22d61b9f76",
        "train/w1/r0/e1": "7ff322c989ecf41b",
        "train/w2/r0/e0": "11ef92e144749656",
        "train/w2/r0/e1": "8e5d1a44b8033aa8",
        "train/w2/r1/e0": "34b6da1147b85ed4",
        "train/w2/r1/e1": "516e4ce2f8629043",
        "eval": "9c97b4604d8e974d",
        "eval_budget": "6c75d632cd136577",
        "fixed_count/e0": "ff7109cbfab80c79",
        "fixed_count/e1": "4e1650a766a0f02b",
    },
    "g2p_transformer": {
        "train/w1/r0/e0": "e6de0346ee2b2209",
        "train/w1/r0/e1": "bdd7fae75dfb76b1",
        "train/w2/r0/e0": "fda3e5d4930feb63",
        "train/w2/r0/e1": "4a1233c666460252",
        "train/w2/r1/e0": "d929ac290b97a26b",
        "train/w2/r1/e1": "4625b702563131bf",
        "eval": "f21e78ec3ad4309a",
        "eval_budget": "3eee58c24f28a450",
        "fixed_count/e0": "aaf516a06e352571",
        "fixed_count/e1": "8990cb3761ee0634",
    },
    "bucket_optimal_default": {
        "train/w1/r0/e0": "71eb0da1611d29fb",
        "train/w1/r0/e1": "d4afd9f4274c9ea1",
        "train/w2/r0/e0": "50347ccbdbf24045",
        "train/w2/r0/e1": "dede433d1f06455b",
        "train/w2/r1/e0": "3d36ad4417d32012",
        "train/w2/r1/e1": "5010413f51119ba7",
        "eval": "6bcda0e33c8dd421",
    },
    "random_default": {
        "train/w1/r0/e0": "348132f6e265cba2",
        "train/w1/r0/e1": "168d2dbd6124e226",
        "train/w2/r0/e0": "11a16f6a1356dbe1",
        "train/w2/r0/e1": "8c301897ec0fa168",
        "train/w2/r1/e0": "27d07d9e595954fa",
        "train/w2/r1/e1": "5abb09a1b792669c",
        "eval": "84aa53cc6ed47762",
    },
}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config_batches_are_unchanged(name):
    got = {label: fingerprint(b) for label, b in shipped_batches(name).items()}
    assert got == FINGERPRINTS[name]


@pytest.mark.parametrize("name", [n for n, (_, o) in SHIPPED.items() if "sampler" not in o])
def test_shipped_config_batches_match_the_oracle(name):
    """token_budget settings (the bucket samplers: test_bucket_matches_the_oracle)."""
    kind, overrides = SHIPPED[name]
    one, two = synthetic_lengths()
    lengths = one if kind == "1d" else two
    d = load_config(data={"Data": overrides}).Data
    got = shipped_batches(name)
    for epoch in (0, 1):
        natural = _old_token_budget_natural(lengths, d.max_tokens, True, d.pool_size, None, 1,
                                            42, epoch)
        assert got[f"train/w1/r0/e{epoch}"] == natural
        for rank in (0, 1):
            assert got[f"train/w2/r{rank}/e{epoch}"] == _old_rank_split(natural, 2, rank)[0]
    assert got["eval_budget"] == _old_token_budget_natural(lengths, d.eval_max_tokens, False, 0,
                                                           None, 1, 0, 0)


# ---------------------------------------------------------------- random inputs vs the oracle
lengths_1d = st.lists(st.integers(1, 400), min_size=1, max_size=300)


@st.composite
def lengths_any(draw):
    rows = draw(lengths_1d)
    if draw(st.booleans()):
        return np.asarray(rows, dtype=draw(st.sampled_from([np.int32, np.int64])))
    tgt = draw(st.lists(st.integers(1, 120), min_size=len(rows), max_size=len(rows)))
    return np.stack([np.asarray(rows), np.asarray(tgt)], axis=1)


@PROPS
@given(lengths=lengths_any(), max_tokens=st.integers(1, 3000), seed=st.integers(0, 2**31),
       pool=st.sampled_from([0, 1, 2, 5, 50]), cap=st.none() | st.integers(1, 40),
       multiple=st.sampled_from([1, 1, 2, 3, 8]), replicas=st.integers(1, 3),
       shuffle=st.booleans())
def test_token_budget_matches_the_oracle(lengths, max_tokens, seed, pool, cap, multiple,
                                         replicas, shuffle):
    for rank in range(replicas):
        s = TokenBudgetBatchSampler(lengths, max_tokens, shuffle=shuffle, pool_size=pool,
                                    max_sentences=cap, batch_size_multiple=multiple, seed=seed,
                                    num_replicas=replicas, rank=rank)
        for epoch in (0, 1, 5):
            s.set_epoch(epoch)
            natural = _old_token_budget_natural(lengths, max_tokens, shuffle, pool, cap,
                                                multiple, seed, epoch)
            mine, pad, repeated = _old_rank_split(natural, replicas, rank)
            assert s.epoch_batches() == mine
            assert list(s) == mine and len(s) == len(mine)
            assert (s.num_repeated_batches, s.num_repeated_examples) == (pad, repeated)
            assert s.batch_counts([epoch]) == [len(natural)]


@PROPS
@given(lengths=lengths_any(), max_tokens=st.integers(200, 3000), seed=st.integers(0, 2**31),
       extra=st.integers(0, 40), replicas=st.integers(1, 3))
def test_fixed_batch_count_matches_the_oracle(lengths, max_tokens, seed, extra, replicas):
    probe = TokenBudgetBatchSampler(lengths, max_tokens, pool_size=2, seed=seed)
    target = min(max(probe.batch_counts(range(3))) + extra, len(lengths))
    for rank in range(replicas):
        s = TokenBudgetBatchSampler(lengths, max_tokens, pool_size=2, seed=seed,
                                    num_replicas=replicas, rank=rank, num_batches=target)
        for epoch in range(3):
            s.set_epoch(epoch)
            natural = _old_token_budget_natural(lengths, max_tokens, True, 2, None, 1, seed,
                                                epoch)
            if len(natural) > target:
                continue
            expected = _old_rank_split(_old_to_count(natural, target), replicas, rank)[0]
            assert s.epoch_batches() == expected


@PROPS
@given(lengths=lengths_1d, seed=st.integers(0, 2**31), shuffle=st.booleans(),
       budget=st.none() | st.integers(1, 2000), batch_size=st.integers(1, 20),
       cap=st.none() | st.integers(1, 30), multiple=st.sampled_from([1, 2, 8]),
       replicas=st.integers(1, 3), cuts=st.lists(st.integers(1, 400), min_size=0, max_size=4))
def test_bucket_matches_the_oracle(lengths, seed, shuffle, budget, batch_size, cap, multiple,
                                   replicas, cuts):
    bounds = sorted(set(cuts) | {max(lengths)})
    bounds = [b for b in bounds if b <= max(lengths)]
    size = {"max_tokens": budget} if budget is not None else {"batch_size": batch_size}
    for rank in range(replicas):
        s = BucketBatchSampler(lengths, bounds, **size, shuffle=shuffle, max_sentences=cap,
                               batch_size_multiple=multiple, seed=seed, num_replicas=replicas,
                               rank=rank)
        bucket_of = np.searchsorted(np.asarray(bounds), np.asarray(lengths), side="left")
        for epoch in (0, 3):
            s.set_epoch(epoch)
            natural = _old_bucket_batches(bucket_of, s.bucket_batch_sizes,
                                          _old_rng(seed, epoch, shuffle))
            mine, pad, repeated = _old_rank_split(natural, replicas, rank)
            assert s.epoch_batches() == mine
            assert (s.num_repeated_batches, s.num_repeated_examples) == (pad, repeated)


@PROPS
@given(lengths=lengths_any(), max_tokens=st.integers(1, 3000), cap=st.none() | st.integers(1, 40),
       multiple=st.integers(1, 9), order_seed=st.integers(0, 2**31),
       sort=st.sampled_from(["sorted", "random", "reversed"]))
def test_pack_by_budget_matches_the_oracle_for_any_order(lengths, max_tokens, cap, multiple,
                                                         order_seed, sort):
    n = len(lengths)
    key = lengths if lengths.ndim == 1 else lengths.sum(axis=1)
    order = {"sorted": np.argsort(key, kind="stable"),
             "random": np.random.default_rng(order_seed).permutation(n),
             "reversed": np.argsort(key, kind="stable")[::-1]}[sort]
    expected = _old_pack_by_budget(order, lengths, max_tokens, cap, multiple)
    assert pack_by_budget(order, lengths, max_tokens, cap, multiple) == expected
    assert pack_by_budget(list(order), lengths.tolist(), max_tokens, cap, multiple) == expected
    if lengths.ndim == 1:
        assert length_sorted_batches(lengths, max_tokens, cap) == _old_pack_by_budget(
            np.argsort(lengths, kind="stable"), lengths, max_tokens, cap)


@PROPS
@given(rows=st.lists(st.tuples(st.sampled_from([0, 0, 1]) | st.integers(0, 60),
                               st.sampled_from([0, 0, 1]) | st.integers(0, 60)),
                     min_size=1, max_size=200),
       two=st.booleans(), max_tokens=st.integers(1, 6) | st.integers(1, 500), cap=st.none() | st.integers(1, 30),
       multiple=st.integers(1, 5), order_seed=st.integers(0, 2**31), shuffled=st.booleans())
def test_pack_by_budget_with_zero_lengths_matches_the_oracle(rows, two, max_tokens, cap, multiple,
                                                             order_seed, shuffled):
    lengths = np.asarray(rows) if two else np.asarray(rows)[:, 0]
    key = lengths if lengths.ndim == 1 else lengths.sum(axis=1)
    order = np.random.default_rng(order_seed).permutation(len(key)) if shuffled \
        else np.argsort(key, kind="stable")
    assert pack_by_budget(order, lengths, max_tokens, cap, multiple) == _old_pack_by_budget(
        order, lengths, max_tokens, cap, multiple)


@PROPS
@given(groups=st.lists(st.tuples(st.integers(0, 300), st.integers(1, 400)), min_size=1,
                       max_size=12),
       max_tokens=st.integers(1, 5000), cap=st.none() | st.integers(1, 90),
       multiple=st.integers(1, 9))
def test_long_groups_of_equal_lengths_match_the_oracle(groups, max_tokens, cap, multiple):
    # sorted lengths in long runs of one length: the packer cuts such a run's batches in one
    # step (zero lengths and lengths over the budget included), which must equal the greedy walk
    lengths = np.sort(np.repeat([g[0] for g in groups], [g[1] for g in groups]))
    order = np.arange(len(lengths))
    assert pack_by_budget(order, lengths, max_tokens, cap, multiple) == _old_pack_by_budget(
        order, lengths, max_tokens, cap, multiple)


@PROPS
@given(lengths=st.lists(st.integers(0, 70) | st.integers(0, 1 << 23), min_size=1, max_size=300),
       max_tokens=st.integers(1, 3000), cap=st.none() | st.integers(1, 40),
       multiple=st.integers(1, 9))
def test_sorted_batch_count_from_the_histogram_matches_the_oracle(lengths, max_tokens, cap,
                                                                  multiple):
    # the sampler's pool size comes from this count (lengths past 2**22: np.unique, not bincount)
    lengths = np.asarray(lengths)
    order = np.argsort(lengths, kind="stable")
    assert sorted_batch_count(lengths, max_tokens, cap, multiple) == len(
        _old_pack_by_budget(order, lengths, max_tokens, cap, multiple))


@pytest.mark.parametrize("two", [False, True])
def test_batches_larger_than_the_doubling_table_match_the_oracle(two):
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 3, 40_000)
    lengths = np.stack([lengths, np.ones_like(lengths)], axis=1) if two else lengths
    order = rng.permutation(len(lengths))
    for cap, multiple in ((None, 1), (30_000, 7)):
        got = pack_by_budget(order, lengths, 60_000, cap, multiple)
        assert got == _old_pack_by_budget(order, lengths, 60_000, cap, multiple)
        assert max(len(b) for b in got) > 16_384  # the batch-by-batch path, not the table


def test_shipped_settings_on_int32_and_memory_mapped_lengths(tmp_path):
    one, two = synthetic_lengths()
    for lengths in (one, two):
        path = tmp_path / f"lengths{lengths.ndim}.npy"
        np.save(path, lengths.astype(np.int32))
        mapped = np.load(path, mmap_mode="r")
        a = TokenBudgetBatchSampler(mapped, 2048, pool_size=100, seed=42, num_replicas=2,
                                    rank=1)
        assert np.shares_memory(a.lengths, mapped)  # not copied
        b = TokenBudgetBatchSampler(lengths.tolist(), 2048, pool_size=100, seed=42,
                                    num_replicas=2, rank=1)
        a.set_epoch(1), b.set_epoch(1)
        natural = _old_token_budget_natural(lengths, 2048, True, 100, None, 1, 42, 1)
        assert a.epoch_batches() == b.epoch_batches() == _old_rank_split(natural, 2, 1)[0]


@pytest.mark.parametrize("two", [False, True])
def test_blocked_doubling_table_matches_the_oracle(monkeypatch, two):
    from ppvarlen.data import order as order_module

    monkeypatch.setattr(order_module, "_BLOCK", 64)  # many blocks on a small input
    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 40, 1000)
    lengths = np.stack([lengths, rng.integers(1, 40, 1000)], axis=1) if two else lengths
    for order in (rng.permutation(1000), np.arange(1000)):
        for cap, multiple in ((None, 1), (7, 3)):
            assert pack_by_budget(order, lengths, 300, cap, multiple) == _old_pack_by_budget(
                order, lengths, 300, cap, multiple)


@pytest.mark.parametrize("top", [32_767, 32_768, 2**31 - 1, 2**31])
@pytest.mark.parametrize("shuffle", [True, False])
def test_keys_at_the_edges_of_the_narrow_sort_types_match_the_oracle(top, shuffle):
    # the sampler sorts and gathers its keys as int16 / int32 when they fit (samplers._narrow)
    rng = np.random.default_rng(top % 1000)
    lengths = np.concatenate([rng.integers(top - 50, top + 1, 300), [top],
                              rng.integers(1, 400, 300)])
    for pool in (0, 3):
        s = TokenBudgetBatchSampler(lengths, 4 * top, shuffle=shuffle, pool_size=pool, seed=7)
        assert s.epoch_batches() == _old_token_budget_natural(lengths, 4 * top, shuffle, pool,
                                                              None, 1, 7, 0)
