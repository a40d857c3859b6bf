"""Samplers: coverage, budget, determinism, sharding and resume (hypothesis properties)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ppvarlen.config import load_config
from ppvarlen.data.errors import DataError
from ppvarlen.data.order import batch_cost, grid_lengths, length_sorted_batches, restore_order
from ppvarlen.data.samplers import (BucketBatchSampler, TokenBudgetBatchSampler,
                                    build_batch_sampler)

PROPS = settings(max_examples=25, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])
length_lists = st.lists(st.integers(1, 300), min_size=1, max_size=250)


def token_budget(lengths, **kw):
    kw.setdefault("max_tokens", 600)
    return TokenBudgetBatchSampler(lengths, **kw)


def bucket(lengths, **kw):
    kw.setdefault("max_tokens", 600)
    return BucketBatchSampler(lengths, [50, 150, 300], pad_to_bucket=True, **kw)


def source_target(lengths, **kw):
    """seq2seq: [n, 2] lengths, cost = size x (max_src + max_tgt)."""
    arr = np.asarray(lengths)
    return token_budget(np.stack([arr, arr // 3 + 1], axis=1), **kw)


SAMPLERS = {"token_budget": token_budget, "bucket": bucket, "seq2seq": source_target}


def padded_cost(sampler, batch):
    if isinstance(sampler, BucketBatchSampler):
        return len(batch) * sampler.pad_length(batch)
    return batch_cost(batch, sampler.lengths)


def flat(batches):
    return sorted(i for b in batches for i in b)


@pytest.mark.parametrize("name", SAMPLERS)
@PROPS
@given(lengths=length_lists, seed=st.integers(0, 3), pool=st.sampled_from([0, 1, 3]))
def test_each_index_once_within_budget(name, lengths, seed, pool):
    kw = {"pool_size": pool} if name != "bucket" else {}
    sampler = SAMPLERS[name](lengths, seed=seed, **kw)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert flat(batches) == list(range(len(lengths)))
    for b in batches:  # budget holds except for an oversize example alone in its batch
        assert padded_cost(sampler, b) <= 600 or len(b) == 1


@pytest.mark.parametrize("name", SAMPLERS)
@PROPS
@given(lengths=st.lists(st.integers(1, 300), min_size=40, max_size=250), seed=st.integers(0, 3))
def test_deterministic_per_seed_epoch_and_reshuffled_across_epochs(name, lengths, seed):
    make = SAMPLERS[name]
    a, b = make(lengths, seed=seed), make(lengths, seed=seed)
    assume(len(a) >= 4)
    for epoch in (0, 3):
        a.set_epoch(epoch), b.set_epoch(epoch)
        assert list(a) == list(b)
    a.set_epoch(0)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first


@pytest.mark.parametrize("name", SAMPLERS)
@PROPS
@given(lengths=length_lists, replicas=st.integers(2, 4), epoch=st.integers(0, 2))
def test_ranks_partition_data_with_equal_batch_counts(name, lengths, replicas, epoch):
    make = SAMPLERS[name]
    ranks = [make(lengths, seed=7, num_replicas=replicas, rank=r) for r in range(replicas)]
    for s in ranks:
        s.set_epoch(epoch)
    per_rank = [list(s) for s in ranks]
    assert len({len(p) for p in per_rank}) == 1
    assert all(len(p) == len(s) for p, s in zip(per_rank, ranks))
    single = make(lengths, seed=7)
    single.set_epoch(epoch)
    real = list(single)
    # interleave ranks back: global batch g lives on rank g % R at position g // R
    merged = [per_rank[g % replicas][g // replicas] for g in range(len(per_rank[0]) * replicas)]
    assert merged[:len(real)] == real
    repeats = merged[len(real):]
    assert len(repeats) == ranks[0].num_repeated_batches < replicas
    assert sum(len(b) for b in repeats) == ranks[0].num_repeated_examples
    assert flat(merged[:len(real)]) == list(range(len(lengths)))


@pytest.mark.parametrize("name", SAMPLERS)
@PROPS
@given(lengths=length_lists, data=st.data())
def test_resume_from_any_step_reproduces_rest_of_epoch(name, lengths, data):
    make = SAMPLERS[name]
    sampler = make(lengths, seed=3)
    sampler.set_epoch(2)
    full = list(sampler)
    step = data.draw(st.integers(0, len(full)))
    it = iter(sampler)
    for _ in range(step):
        next(it)
    state = sampler.state_dict()
    fresh = make(lengths, seed=0)  # seed comes from the state
    fresh.load_state_dict(state)
    assert len(fresh) == len(full) - step
    assert list(fresh) == full[step:]
    assert list(fresh) == full  # the next pass is a full epoch again


@PROPS
@given(lengths=st.lists(st.integers(1, 300), min_size=2, max_size=250), seed=st.integers(0, 3),
       extra=st.integers(0, 6), replicas=st.integers(1, 3))
def test_fixed_batch_count_every_epoch_keeps_coverage_and_budget(lengths, seed, extra, replicas):
    counts = token_budget(lengths, pool_size=2, seed=seed).batch_counts(range(4))
    n = min(max(counts) + extra, len(lengths))
    assume(n >= max(counts))
    for rank in range(replicas):
        s = token_budget(lengths, pool_size=2, seed=seed, num_batches=n,
                         num_replicas=replicas, rank=rank)
        for epoch in range(4):
            s.set_epoch(epoch)
            assert len(s) == -(-n // replicas)  # the same every epoch, on every rank
    s = token_budget(lengths, pool_size=2, seed=seed, num_batches=n)
    for epoch in range(4):
        s.set_epoch(epoch)
        batches = s.epoch_batches()
        assert len(batches) == n
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        assert all(padded_cost(s, b) <= 600 or len(b) == 1 for b in batches)


def test_fixed_batch_count_below_an_epochs_count_is_refused():
    lengths = np.random.default_rng(0).integers(1, 300, size=400)
    counts = token_budget(lengths, pool_size=2).batch_counts(range(3))
    s = token_budget(lengths, pool_size=2, num_batches=min(counts) - 1)
    with pytest.raises(DataError, match="num_batches"):
        s.epoch_batches()


def test_state_dict_takes_consumed_count_and_resets_on_new_epoch():
    s = token_budget(list(range(1, 200)), seed=1)
    it = iter(s)
    next(it), next(it), next(it)
    assert s.state_dict(batches_consumed=1)["batches_yielded"] == 1
    assert token_budget(list(range(1, 50)), num_replicas=3, rank=2).state_dict() == {
        "epoch": 0, "seed": 0, "batches_yielded": 0, "num_replicas": 3, "rank": 2,
        "num_examples": 49}
    assert s.state_dict()["batches_yielded"] == 3
    s.set_epoch(1)
    assert s.state_dict()["batches_yielded"] == 0


def test_resume_refuses_changed_world_or_data():
    s = token_budget(list(range(1, 100)), num_replicas=2, rank=0)
    state = s.state_dict()
    with pytest.raises(ValueError, match="num_replicas"):
        token_budget(list(range(1, 100))).load_state_dict(state)
    with pytest.raises(ValueError, match="num_examples"):
        token_budget(list(range(1, 50)), num_replicas=2).load_state_dict(state)


def test_oversize_own_batch_or_error():
    lengths = [10, 900, 20, 30]
    s = token_budget(lengths)
    assert s.num_oversize == 1 and [1] in list(s)
    with pytest.raises(DataError, match=r"#1 \(900 tokens\).*Data.max_tokens"):
        token_budget(lengths, oversize="error")
    b = bucket([10, 290, 20], max_tokens=100)
    assert b.num_oversize == 1 and [1] in list(b)


def test_token_budget_caps_and_multiple():
    lengths = [5] * 100
    s = token_budget(lengths, max_tokens=1000, max_sentences=24, batch_size_multiple=8)
    sizes = sorted(len(b) for b in s)
    assert max(sizes) == 24 and all(n % 8 == 0 for n in sizes[1:]) and sum(sizes) == 100


def test_seq2seq_budget_counts_source_and_target():
    lengths = np.array([[10, 40], [40, 10], [10, 10], [12, 12]])
    s = TokenBudgetBatchSampler(lengths, max_tokens=100, shuffle=False)
    for b in s:
        rows = lengths[b]
        assert len(b) * (rows[:, 0].max() + rows[:, 1].max()) <= 100 or len(b) == 1


def test_bucket_batch_sizes_are_memory_flat_and_pad_length():
    lengths = [10, 40, 45, 100, 120, 250] * 10
    b = BucketBatchSampler(lengths, [50, 128, 256], max_tokens=512, pad_to_bucket=True)
    assert b.bucket_batch_sizes == [10, 4, 2]
    for batch in b:
        pad = b.pad_length(batch)
        assert pad in (50, 128, 256) and len(batch) * pad <= 512
    fixed = BucketBatchSampler(lengths, [50, 128, 256], batch_size=3)
    assert all(fixed.pad_length(x) == max(lengths[i] for i in x) for x in fixed)
    with pytest.raises(ValueError, match="last bucket boundary"):
        BucketBatchSampler(lengths, [50, 128], batch_size=3)


def test_eval_order_is_the_shared_length_sorted_order():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, 300)
    s = TokenBudgetBatchSampler(lengths, max_tokens=1000, shuffle=False)
    assert list(s) == length_sorted_batches(lengths, 1000)
    batches = length_sorted_batches(lengths, 1000, max_batch_size=16)
    outs = [np.asarray(b) * 10 for b in batches]  # a fake model: output = 10 * input index
    assert restore_order(batches, outs) == [i * 10 for i in range(300)]


def test_restore_order_rejects_mismatch():
    with pytest.raises(ValueError, match="batch 0 has 2 examples but 1 output rows"):
        restore_order([[0, 1]], [[5]])
    with pytest.raises(ValueError, match="repeated"):
        restore_order([[0, 0]], [[5, 6]])


class _Lengths:
    def __init__(self, lengths):
        self.lengths = np.asarray(lengths)


@pytest.mark.parametrize("sampler,cls", [("token_budget", TokenBudgetBatchSampler),
                                         ("bucket", BucketBatchSampler),
                                         ("random", BucketBatchSampler)])
def test_build_batch_sampler_reads_config(sampler, cls):
    cfg = load_config(data={"Data": {"sampler": sampler, "max_tokens": 800, "batch_size": 7,
                                     "num_buckets": 3}})
    ds = _Lengths(np.random.default_rng(1).integers(1, 300, 500))
    s = build_batch_sampler(ds, cfg.Data, shuffle=True, seed=5)
    assert isinstance(s, cls) and flat(list(s)) == list(range(500))
    if sampler == "random":
        assert sorted(len(b) for b in s)[1:] == [7] * (len(s) - 1)
    if sampler == "bucket":
        assert len(s.boundaries) <= 3


def test_build_bucket_rejects_boundaries_below_data():
    cfg = load_config(data={"Data": {"sampler": "bucket", "buckets": [10, 20]}})
    with pytest.raises(DataError, match="Data.buckets"):
        build_batch_sampler(_Lengths([5, 15, 25]), cfg.Data, shuffle=False)


@pytest.mark.parametrize("make", [lambda ls: BucketBatchSampler(ls, [100, 300], batch_size=10),
                                  lambda ls: TokenBudgetBatchSampler(ls, 600, pool_size=2)])
def test_batch_composition_is_reshuffled_not_just_batch_order(make):
    lengths = np.random.default_rng(0).integers(1, 300, 400)
    s = make(lengths)
    compositions = []
    for epoch in (0, 1):
        s.set_epoch(epoch)
        compositions.append(sorted(tuple(sorted(b)) for b in s))
    assert compositions[0] != compositions[1]


def test_bucket_with_null_max_tokens_uses_fixed_batch_size():
    cfg = load_config(data={"Data": {"sampler": "bucket", "max_tokens": None, "batch_size": 5,
                                     "buckets": [100, 300]}})
    s = build_batch_sampler(_Lengths(np.arange(1, 301)), cfg.Data, shuffle=True)
    assert s.bucket_batch_sizes == [5, 5]
    from ppvarlen.config import ConfigError

    with pytest.raises(ConfigError, match="Data.max_tokens"):
        build_batch_sampler(_Lengths([3, 4]), load_config(
            data={"Data": {"max_tokens": None}}).Data, shuffle=True)


@PROPS
@given(lengths=length_lists, cap=st.none() | st.integers(1, 40), multiple=st.integers(1, 8),
       max_tokens=st.integers(50, 2000))
def test_pack_by_budget_caps_multiples_and_budget(lengths, cap, multiple, max_tokens):
    from ppvarlen.data.order import pack_by_budget

    arr = np.asarray(lengths)
    batches = pack_by_budget(np.argsort(arr, kind="stable"), arr, max_tokens, cap, multiple)
    assert flat(batches) == list(range(len(lengths)))
    for k, b in enumerate(batches):
        assert cap is None or len(b) <= cap
        assert batch_cost(b, arr) <= max_tokens or len(b) == 1
        if k < len(batches) - 1:  # closed batches: trimmed to a multiple unless already small
            assert len(b) <= multiple or len(b) % multiple == 0


def test_each_epoch_is_packed_once(monkeypatch):
    from ppvarlen.data import samplers

    packs = []
    real = samplers.budget_cuts
    monkeypatch.setattr(samplers, "budget_cuts", lambda *a, **k: packs.append(1) or real(*a, **k))
    lengths = np.random.default_rng(0).integers(1, 300, 2000)
    s = token_budget(lengths, pool_size=3, seed=1)
    assert len(packs) == 0  # the sorted split's batch count (pool size) is from the histogram
    counts = s.batch_counts(range(3))
    assert len(packs) == 3 and s.batch_counts([2, 0]) == [counts[2], counts[0]]
    assert len(packs) == 3  # counts are kept
    s.num_batches = max(counts) + 2
    for epoch in (0, 1):
        s.set_epoch(epoch)
        before = len(packs)
        n = len(s)
        assert list(s) == s.epoch_batches() and len(s) == n and s.batch_size > 0
        s.load_state_dict(s.state_dict(batches_consumed=1))
        assert len(s) == n - 1
        assert len(packs) - before <= 1
    ev = token_budget(lengths, shuffle=False)
    before = len(packs)
    assert list(ev) == ev.epoch_batches() and ev.batch_counts([0, 1]) == [len(ev)] * 2
    assert len(packs) == before + 1  # the unshuffled epoch is packed once, when first asked
    assert len(ev) == samplers.sorted_batch_count(lengths, 600)  # what set the pool size


def test_pack_by_budget_rejects_bad_lengths_and_runs():
    from ppvarlen.data.order import budget_cuts, pack_by_budget

    with pytest.raises(ValueError, match=">= 0"):
        pack_by_budget([0, 1], [3, -1], 10)
    for bad in ([2], [3, 3], [0, 3], [2, 1, 3]):
        with pytest.raises(ValueError, match="segment_ends"):
            budget_cuts(np.array([1, 2, 3]), 10, segment_ends=bad)
    assert pack_by_budget([], [1, 2], 10) == []
    for bad in ({"max_tokens": 0}, {"max_batch_size": 0}, {"batch_size_multiple": 0}):
        with pytest.raises(ValueError, match="must be >= 1"):  # checked even with nothing to pack
            pack_by_budget([], [1, 2], **{"max_tokens": 10, **bad})
    # hand-worked, budget 10: 2,3 (+4: 3 x 4 = 12 closes), 4,5 (2 x 5 = 10 fits)
    assert pack_by_budget([0, 1, 2, 3], [2, 3, 4, 5], 10) == [[0, 1], [2, 3]]
    # 2,2,2 (+5: 4 x 5 = 20 closes), 5; in runs [0:1] and [1:4]: 2 | 2,2 (+5: 15 closes), 5
    assert budget_cuts(np.array([2, 2, 2, 5]), 10).tolist() == [3, 4]
    assert budget_cuts(np.array([2, 2, 2, 5]), 10, segment_ends=[1, 4]).tolist() == [1, 3, 4]
    # unsorted order, cap 2, multiple 2: 5,1 | 1,1 | 9 alone (over the budget) | 1
    assert pack_by_budget([0, 1, 2, 3, 4, 5], [5, 1, 1, 1, 9, 1], 10, 2, 2) == \
        [[0, 1], [2, 3], [4], [5]]
    # [n, 2]: cost = size x (max_src + max_tgt): (1,4),(4,1) -> 2 x 8 = 16 > 10
    assert pack_by_budget([0, 1, 2], [[1, 4], [4, 1], [1, 1]], 10) == [[0], [1, 2]]


def test_length_sorted_batches_sorts_pairs_by_their_sum_and_rejects_other_shapes():
    # sums 6, 2, 4 -> order 1, 2, 0; budget 8: [1] + [2] costs 2 x (2 + 2) = 8, + [0] 3 x 7 = 21
    assert length_sorted_batches([[5, 1], [1, 1], [2, 2]], 8) == [[1, 2], [0]]
    assert length_sorted_batches([[5, 1], [1, 1], [2, 2]], 100) == [[1, 2, 0]]
    assert length_sorted_batches([3, 1, 2, 1], 4) == [[1, 3], [2], [0]]
    assert length_sorted_batches([1, 1, 1, 1, 1], 100, max_batch_size=2) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match=r"\[n\] or \[n, k\], got shape \(1, 2, 2\)"):
        length_sorted_batches(np.ones((1, 2, 2), dtype=int), 8)


def test_restore_order_names_each_mismatch():
    with pytest.raises(ValueError, match="restore_order: 2 batches but 1 outputs"):
        restore_order([[0], [1]], [[5]])
    for bad in ([[0, 2]], [[-1, 0]]):  # out of range at either end
        with pytest.raises(ValueError, match="index -?[0-9] in batch 0 is out of range"):
            restore_order(bad, [[5, 6]])
    assert restore_order([[1], [0]], [["b"], ["a"]]) == ["a", "b"]


def test_resume_past_the_epoch_end_is_refused_with_the_counts():
    s = token_budget(list(range(1, 200)), seed=1)
    state = s.state_dict(batches_consumed=len(s) + 1)
    with pytest.raises(ValueError, match=rf"batches_yielded={len(s) + 1} but epoch 0 has "
                                         rf"{len(s)} batches on this rank"):
        token_budget(list(range(1, 200))).load_state_dict(state)


def test_batch_cost_counts_each_columns_padding():
    assert batch_cost([0, 1], [[1, 4], [4, 1]]) == 2 * (4 + 4)  # B x (max_src + max_tgt)
    assert batch_cost([2, 0], [3, 1, 5]) == 2 * 5


def test_zero_lengths_never_close_a_batch():
    from ppvarlen.data.order import pack_by_budget

    # cost 0 however many: one batch (a budget of 3 counts tokens, not examples)
    assert pack_by_budget(range(6), [0] * 6, 3) == [list(range(6))]
    # the first length-1 example makes 5 x 1 = 5 > 3: it opens the next batch (2 x 1 fits)
    assert pack_by_budget(range(6), [0, 0, 0, 0, 1, 1], 3) == [[0, 1, 2, 3], [4, 5]]


def test_bucket_sampler_refuses_bad_lengths_and_boundaries():
    with pytest.raises(ValueError, match=r"^BucketBatchSampler needs 1-D lengths$"):
        BucketBatchSampler([[1, 2]], [10], batch_size=2)  # the whole message
    with pytest.raises(ValueError, match=r"strictly increasing positive ints, got \[30, 20\]"):
        BucketBatchSampler([5], [30, 20], batch_size=2)
    # a boundary over the budget: one example per batch (each alone costs > max_tokens)
    assert BucketBatchSampler([250, 260], [300], max_tokens=100).bucket_batch_sizes == [1]


def test_build_batch_sampler_passes_caps_multiples_and_bucket_method():
    lengths = np.random.default_rng(2).integers(1, 300, 400)
    cfg = load_config(data={"Data": {"sampler": "bucket", "max_tokens": 800, "buckets": [100, 300],
                                     "max_sentences": 5, "batch_size_multiple": 2}})
    # 800 // 100 = 8, capped at 5, down to a multiple of 2: 4; 800 // 300 = 2
    assert build_batch_sampler(_Lengths(lengths), cfg.Data, True).bucket_batch_sizes == [4, 2]
    cfg = load_config(data={"Data": {"max_tokens": 800, "pool_size": 2, "max_sentences": 3,
                                     "batch_size_multiple": 2}})
    s = build_batch_sampler(_Lengths(lengths), cfg.Data, shuffle=True, seed=5)
    sizes = [len(b) for b in s]
    assert max(sizes) <= 3 and sizes.count(3) < sizes.count(2)  # capped, then trimmed to 2
    cfg = load_config(data={"Data": {"sampler": "bucket", "bucket_method": "quantile",
                                     "num_buckets": 3, "pad_to_multiple_of": 8}})
    s = build_batch_sampler(_Lengths(lengths), cfg.Data, shuffle=True)
    assert all(b % 8 == 0 for b in s.boundaries) and s.boundaries[-1] >= lengths.max()


def test_batch_by_batch_path_checks_a_batchs_second_example():
    from ppvarlen.data.order import budget_cuts, pack_by_budget

    # [n, 2] with a zero length takes the batch-by-batch path; budget 10:
    # 0,5 (2 x 5 = 10 fits; + 9: 27) | 9 (+ 9: 2 x 9 = 18 > 10) | 9
    pairs = [[0, 0], [5, 0], [9, 0], [9, 0]]
    assert pack_by_budget([0, 1, 2, 3], pairs, 10) == [[0, 1], [2], [3]]
    assert budget_cuts(np.zeros(0, dtype=np.int64), 10).tolist() == []


def test_oversize_error_lists_five_and_says_there_are_more():
    with pytest.raises(DataError, match=r"6 example\(s\).*#4 \(900 tokens\) \.\.\.\. Raise"):
        token_budget([900] * 6 + [10], oversize="error")
    with pytest.raises(DataError, match=r"#4 \(900 tokens\)\. Raise"):
        token_budget([900] * 5 + [10], oversize="error")


def test_grid_lengths_hand_worked():
    """1, 2, 7, max_len and every boundary with its neighbours, clipped to 1..max_len."""
    assert grid_lengths(32, [8, 16]) == [1, 2, 7, 8, 9, 15, 16, 17, 32]
    assert grid_lengths(32, None) == grid_lengths(32, []) == [1, 2, 7, 32]
    assert grid_lengths(5, [1, 5]) == [1, 2, 4, 5]  # 0, 6 and 7 are outside 1..5
    assert grid_lengths(1, [1]) == [1]


def test_export_parity_and_the_serving_admission_check_share_one_grid():
    from ppvarlen.runtime import admission
    from ppvarlen.export import parity

    assert parity.grid_lengths is grid_lengths and admission.grid_lengths is grid_lengths
