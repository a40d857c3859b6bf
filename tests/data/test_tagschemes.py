"""Tag schemes: chunks and scores against conlleval's rules written out as tables, scheme
detection and load-time validation, and a random cross-check with seqeval's default mode
(conlleval's rules, extended to IOBES) when it is installed."""
import random

import pytest

from ppvarlen.data import tagschemes
from ppvarlen.metrics import entity_prf, tagging_metrics, token_accuracy

# (scheme, tags, chunks as (type, start, end_exclusive)) -- worked out by conlleval's
# startOfChunk / endOfChunk rules; E/S as seqeval extends them (conlleval has no S: it would
# merge "S-PER S-PER" into one chunk).
CHUNK_TABLE = [
    ("bio", ["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 2), ("LOC", 3, 4)]),
    ("bio", ["O", "O"], []),
    ("bio", ["B-PER", "B-PER"], [("PER", 0, 1), ("PER", 1, 2)]),
    ("bio", ["O", "I-PER", "I-PER", "O"], [("PER", 1, 3)]),            # I after O starts
    ("bio", ["I-ORG"], [("ORG", 0, 1)]),                                 # I at the start
    ("bio", ["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 3)]),  # B-X I-Y
    ("bio", ["I-PER", "B-PER", "I-PER"], [("PER", 0, 1), ("PER", 1, 3)]),
    ("bio", ["B-PER", "I-PER", "I-LOC", "B-LOC"], [("PER", 0, 2), ("LOC", 2, 3), ("LOC", 3, 4)]),
    ("bio", ["B", "I", "O", "I", "B"], [("", 0, 2), ("", 3, 4), ("", 4, 5)]),  # untyped
    ("bioes", ["B-PER", "E-PER", "S-LOC", "O"], [("PER", 0, 2), ("LOC", 2, 3)]),
    ("bioes", ["B-PER", "I-PER", "I-PER", "E-PER"], [("PER", 0, 4)]),
    ("bioes", ["S-PER", "S-PER"], [("PER", 0, 1), ("PER", 1, 2)]),
    ("bioes", ["O", "E-PER", "O"], [("PER", 1, 2)]),                    # E after O starts
    ("bioes", ["B-PER", "I-PER", "O"], [("PER", 0, 2)]),                # unclosed: O ends it
    ("bioes", ["B-PER", "I-PER"], [("PER", 0, 2)]),                     # unclosed at the end
    ("bioes", ["E-PER", "I-PER", "E-PER"], [("PER", 0, 1), ("PER", 1, 3)]),  # I after E starts
    ("bioes", ["S-PER", "E-PER"], [("PER", 0, 1), ("PER", 1, 2)]),      # E after S starts
    ("bioes", ["S-PER", "I-PER", "E-PER"], [("PER", 0, 1), ("PER", 1, 3)]),
    ("bioes", ["B-PER", "S-PER"], [("PER", 0, 1), ("PER", 1, 2)]),      # S ends the B chunk
    ("bioes", ["B-PER", "E-LOC"], [("PER", 0, 1), ("LOC", 1, 2)]),      # B-X E-Y
    ("bioes", ["B-PER", "I-PER", "B-PER", "E-PER"], [("PER", 0, 2), ("PER", 2, 4)]),
    ("bioes", ["I-LOC", "I-LOC", "E-LOC", "S-ORG"], [("LOC", 0, 3), ("ORG", 3, 4)]),
    ("bmes", ["B", "M", "E", "S", "B", "E"], [("", 0, 3), ("", 3, 4), ("", 4, 6)]),
    ("bmes", ["S", "M", "E"], [("", 0, 1), ("", 1, 3)]),                # M after S starts
    ("bmes", ["B", "B", "E"], [("", 0, 1), ("", 1, 3)]),
    ("bmes", ["M", "M"], [("", 0, 2)]),                                 # M at the start
    ("bmes", ["E", "E", "S"], [("", 0, 1), ("", 1, 2), ("", 2, 3)]),
    ("bmes", ["B-NR", "E-NR", "S-VV", "B-NN", "M-NN", "E-NN"],
     [("NR", 0, 2), ("VV", 2, 3), ("NN", 3, 6)]),
    ("bmes", ["B-NR", "M-NR", "O", "B-ORG", "E-LOC"], [("NR", 0, 2), ("ORG", 3, 4), ("LOC", 4, 5)]),
]


@pytest.mark.parametrize("scheme,tags,expected", CHUNK_TABLE,
                         ids=[f"{s}-{'_'.join(t)}" for s, t, _ in CHUNK_TABLE])
def test_chunks_follow_conlleval_rules(scheme, tags, expected):
    assert tagschemes.chunks(tags, scheme) == expected


# (scheme, gold sequences, predicted sequences, tp, found chunks predicted, gold chunks,
#  tokens right) -- the counts conlleval prints (accuracy = tokens right / tokens).
SCORE_TABLE = [
    ("bio", [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG"]],
     [["B-PER", "I-PER", "O", "O"], ["B-ORG", "I-ORG", "O"]], 1, 2, 3, 5),
    ("bio", [["O", "B-LOC", "I-LOC", "O"]], [["O", "I-LOC", "I-LOC", "O"]], 1, 1, 1, 3),
    ("bio", [["B-PER", "I-PER", "I-PER"]], [["B-PER", "I-LOC", "I-PER"]], 0, 3, 1, 2),
    ("bioes", [["B-PER", "E-PER", "O", "S-LOC"], ["S-ORG", "S-ORG"]],
     [["B-PER", "E-PER", "O", "B-LOC"], ["S-ORG", "E-ORG"]], 4, 4, 4, 4),  # ill-formed, same chunks
    ("bioes", [["B-LOC", "I-LOC", "E-LOC"]], [["B-LOC", "I-LOC", "O"]], 0, 1, 1, 2),
    ("bmes", [["B", "E", "S", "B", "M", "E"]], [["B", "E", "B", "E", "M", "E"]], 1, 3, 3, 4),
    ("bmes", [["S", "S", "B", "E"]], [["S", "S", "B", "E"]], 3, 3, 3, 4),
]


@pytest.mark.parametrize("scheme,gold,pred,tp,found,gold_n,right", SCORE_TABLE)
def test_scores_match_conlleval_counts(scheme, gold, pred, tp, found, gold_n, right):
    out = entity_prf(pred, gold, scheme)
    p, r = tp / found, tp / gold_n
    assert out["precision"] == pytest.approx(p)
    assert out["recall"] == pytest.approx(r)
    assert out["f1"] == pytest.approx(2 * p * r / (p + r) if p + r else 0.0)
    assert token_accuracy(pred, gold) == pytest.approx(right / sum(map(len, gold)))
    names = sorted({t for seq in gold + pred for t in seq})
    names += tagschemes.complete(names, scheme)  # as at load time: "S S B E" alone reads BIOES
    report = tagging_metrics(pred, gold, names)  # the scheme read from the label names
    assert report["tag_scheme"] == scheme and report["f1"] == out["f1"]
    assert report["token_accuracy"] == token_accuracy(pred, gold)


def test_per_type_f1_by_scheme():
    gold = [["B-PER", "E-PER", "S-LOC", "O"]]
    pred = [["B-PER", "E-PER", "O", "S-LOC"]]
    assert entity_prf(pred, gold, "bioes")["per_type_f1"] == {"LOC": 0.0, "PER": 1.0}


def test_plain_tags_report_token_accuracy_not_chunks():
    gold = [["NN", "VV", "NN"], ["PU"]]
    pred = [["NN", "NN", "NN"], ["PU"]]
    out = tagging_metrics(pred, gold, ["NN", "PU", "VV"])
    assert out["tag_scheme"] == "plain"
    assert out["token_accuracy"] == pytest.approx(3 / 4)
    assert "not applicable" in out["chunk_metrics"]
    assert out["f1"] == out["token_accuracy"]  # token-level micro F1, never a made-up 0
    # per tag: NN tp=2 pred=3 gold=2 -> 0.8; VV 0; PU 1
    assert out["per_type_f1"] == pytest.approx({"NN": 0.8, "PU": 1.0, "VV": 0.0})
    assert out["macro_f1"] == pytest.approx((0.8 + 0.0 + 1.0) / 3)
    with pytest.raises(ValueError, match="plain tags have no chunks"):
        tagschemes.chunks(["NN"], "plain")


def test_seqeval_default_mode_agrees_on_random_sequences():
    """seqeval's default mode is conlleval's rules extended to IOBES; BMES is IOBES with M."""
    get_entities = pytest.importorskip("seqeval.metrics.sequence_labeling").get_entities
    rng = random.Random(0)
    for scheme, prefixes in (("bio", "BI"), ("bioes", "BIES"), ("bmes", "BMES")):
        tags = ["O"] + [f"{p}-{t}" for p in prefixes for t in ("PER", "LOC")]
        for _ in range(400):
            seq = [rng.choice(tags) for _ in range(rng.randint(1, 9))]
            as_iobes = [t.replace("M-", "I-", 1) for t in seq]
            want = [(t, s, e + 1) for t, s, e in get_entities(as_iobes)]
            assert tagschemes.chunks(seq, scheme) == want, (scheme, seq)


def test_repairs_are_counted_exactly_when_the_validator_rejects_the_sequence():
    """read_chunks counts a repair for a BIOES/BMES sequence iff the data validator
    (sequence_problem, written separately) rejects it; a well-formed sequence reads unrepaired."""
    rng = random.Random(1)
    for scheme, prefixes in (("bioes", "BIES"), ("bmes", "BMES")):
        tags = ["O"] + [f"{p}-{t}" for p in prefixes for t in ("PER", "LOC")]
        for _ in range(600):
            seq = [rng.choice(tags) for _ in range(rng.randint(1, 9))]
            found, repaired = tagschemes.read_chunks(seq, scheme)
            assert found == tagschemes.chunks(seq, scheme)
            assert (repaired > 0) == (tagschemes.sequence_problem(seq, scheme) is not None), seq
    # BIO allows any I-X after B-X/I-X; an I that starts a chunk (after O or another type) is
    # the one repair
    assert tagschemes.read_chunks(["B-PER", "I-PER", "I-PER"], "bio") == ([("PER", 0, 3)], 0)
    assert tagschemes.read_chunks(["O", "I-PER", "B-LOC", "I-PER"], "bio") == (
        [("PER", 1, 2), ("LOC", 2, 3), ("PER", 3, 4)], 2)


@pytest.mark.parametrize("tags,scheme", [
    ({"O", "B-PER", "I-PER"}, "bio"),
    ({"O", "B-PER"}, "bio"),
    ({"B", "I", "O"}, "bio"),
    ({"O", "B-PER", "I-PER", "E-PER", "S-LOC"}, "bioes"),
    ({"O", "S-LOC"}, "bioes"),
    ({"B", "M", "E", "S"}, "bmes"),
    ({"B-NAME", "M-NAME", "E-NAME", "S-ORG", "O"}, "bmes"),
    ({"NN", "VV", "PU", "M"}, "plain"),  # CTB's M (measure word) among POS tags is plain
    ({"n", "v", "O"}, "plain"),
])
def test_detect(tags, scheme):
    assert tagschemes.detect(tags) == scheme


@pytest.mark.parametrize("tags,words", [
    ({"B-PER", "I-PER", "NN"}, "chunk tags"),
    ({"B-PER", "I-PER", "M-PER"}, "middle"),
])
def test_detect_rejects_mixed_tag_sets(tags, words):
    with pytest.raises(ValueError, match=words):
        tagschemes.detect(tags)


def test_sequence_problem_per_scheme():
    assert tagschemes.sequence_problem(["O", "I-PER"], "bio") is None  # IOB1 style is read
    assert "not a BIO tag" in tagschemes.sequence_problem(["B-PER", "E-PER"], "bio")
    assert tagschemes.sequence_problem(["B-PER", "E-PER", "S-LOC", "O"], "bioes") is None
    assert "not closed" in tagschemes.sequence_problem(["B-PER", "O"], "bioes")
    assert "not closed" in tagschemes.sequence_problem(["B-PER", "I-PER"], "bioes")
    assert "does not continue" in tagschemes.sequence_problem(["O", "I-PER", "E-PER"], "bioes")
    assert "does not continue" in tagschemes.sequence_problem(["B-PER", "E-LOC"], "bioes")
    assert tagschemes.sequence_problem(["B", "M", "E", "S"], "bmes") is None
    assert "not a BMES tag" in tagschemes.sequence_problem(["B", "I", "E"], "bmes")
    assert tagschemes.sequence_problem(["NN", "O", "B-X"], "plain") is None
    assert "not a PLAIN tag" in tagschemes.sequence_problem(["N N"], "plain")


def test_complete_adds_what_the_names_need_to_say_the_scheme():
    assert tagschemes.complete(["O", "B-PER", "I-PER"], "bio") == []
    assert tagschemes.complete(["O", "B-PER", "I-PER"], "bioes") == ["E-PER", "S-PER"]
    assert tagschemes.complete(["B", "E", "S"], "bmes") == ["M"]
    assert tagschemes.order({"S-A", "O", "E-A", "B-A", "I-A", "B-B"}, "bioes") == [
        "O", "B-A", "I-A", "E-A", "S-A", "B-B"]


def test_config_offers_every_scheme():
    from ppvarlen.config_schema import SCHEMA

    assert SCHEMA["Data"]["tag_scheme"].choices == ("auto", *tagschemes.SCHEME)
