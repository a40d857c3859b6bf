"""TextEncoder: special ids, deterministic order, min_freq/max_size, modes, files, UNK rate."""
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppvarlen.config import ConfigError, load_config
from ppvarlen.data.sources import load_corpus
from ppvarlen.data.errors import DataError
from ppvarlen.data.readers import FORMATS
from ppvarlen.data.vocab import (MAX_FILE_BYTES, SPECIAL_TOKENS, TextEncoder, TokenCounting,
                                  build_encoder, count_fields, escape_token, unescape_token)


def test_special_ids_are_fixed():
    enc = TextEncoder.build(["你好世界"])
    assert enc.tokens[:6] == list(SPECIAL_TOKENS)
    assert (enc.pad_id, enc.unk_id, enc.cls_id, enc.sep_id, enc.bos_id, enc.eos_id) == (0, 1, 2, 3, 4, 5)
    assert enc.special_ids == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "bos": 4, "eos": 5}
    assert enc.vocab_size == 6 + 4


def test_order_is_frequency_then_token():
    enc = TextEncoder.build(["bba", "cab", "d"])  # b:3 a:2 c:1 d:1
    assert enc.tokens[6:] == ["b", "a", "c", "d"]
    assert enc.encode(list("abcdz")) == [7, 6, 8, 9, 1]
    again = TextEncoder.build(["d", "cab", "bba"])  # input order does not matter
    assert again.tokens == enc.tokens


def test_min_freq_and_max_size():
    texts = ["aaaa", "bbb", "cc", "d"]
    enc = TextEncoder.build(texts, min_freq=2)
    assert enc.tokens[6:] == ["a", "b", "c"]
    assert enc.encode(["d"]) == [enc.unk_id]
    assert enc.stats["types_below_min_freq"] == 1
    assert enc.stats["train_unk_rate"] == pytest.approx(1 / 10)
    enc = TextEncoder.build(texts, max_size=8)  # 6 specials + 2
    assert enc.vocab_size == 8 and enc.tokens[6:] == ["a", "b"]
    assert enc.stats["types_over_max_size"] == 2
    with pytest.raises(ConfigError, match="Data.max_size"):
        TextEncoder.build(texts, max_size=6)
    with pytest.raises(ConfigError, match="Data.min_freq"):
        TextEncoder.build(texts, min_freq=0)


def test_word_mode_and_lowercase():
    enc = TextEncoder.build(["Hello world", "hello  Paddle"], kind="word", lowercase=True)
    assert enc.tokenize("HELLO  Paddle\tworld") == ["hello", "paddle", "world"]
    assert enc.tokens[6:] == ["hello", "paddle", "world"]
    assert enc.encode(enc.tokenize("Hello unknown")) == [6, enc.unk_id]
    assert enc.encode(["PADDLE"]) == [7]  # given tokens (tagging) are lowercased too
    cased = TextEncoder.build(["Hello hello"], kind="word")
    assert cased.tokens[6:] == ["Hello", "hello"]


def test_char_mode_keeps_whitespace_chars_and_tagging_token_lists():
    enc = TextEncoder.build(["好 书\u3000推荐", ["北", "京"]])
    assert enc.tokenize("好 书") == ["好", " ", "书"]
    assert " " in enc.tokens and "\u3000" in enc.tokens and "北" in enc.tokens
    assert enc.decode(enc.encode(list("好 书"))) == ["好", " ", "书"]


def test_literal_special_strings_in_text_are_unk():
    enc = TextEncoder.build(["a [SEP] b [CLS]"], kind="word")
    assert "[SEP]" not in enc.tokens[6:]
    assert enc.encode(["[SEP]", "[PAD]", "a"]) == [enc.unk_id, enc.unk_id, enc.tokens.index("a")]


def test_decode_and_unk_rate():
    enc = TextEncoder.build(["abc"])
    ids = [enc.cls_id] + enc.encode(list("abz")) + [enc.sep_id, enc.pad_id, enc.pad_id]
    assert enc.decode(ids) == ["[CLS]", "a", "b", "[UNK]", "[SEP]", "[PAD]", "[PAD]"]
    assert enc.decode(ids, skip_special=True) == ["a", "b", "[UNK]"]
    # 1 UNK among 3 real tokens, then 1 among 2: specials and pads not counted
    assert enc.unk_rate([ids, enc.encode(list("zc"))]) == pytest.approx(2 / 5)
    assert enc.unk_rate([]) == 0.0
    with pytest.raises(DataError, match="outside the vocabulary"):
        enc.decode([999])


def test_a_vocabulary_or_encoder_json_past_the_bound_is_refused_unread(tmp_path):
    """Both are read whole into memory: a file larger than any vocabulary needs (a crafted
    export's, made sparse here) is refused naming its size, and nothing is allocated for it."""
    TextEncoder.build(["中文句子", "结束"]).save(str(tmp_path))
    assert TextEncoder.load(str(tmp_path)).vocab_size > 0
    for name in ("encoder.json", "vocab.txt"):
        os.truncate(tmp_path / name, MAX_FILE_BYTES + 1)
        with pytest.raises(DataError, match=rf"{name}: cannot be read \({MAX_FILE_BYTES + 1:,} "
                                            rf"bytes, more than the {MAX_FILE_BYTES:,} an? "
                                            rf"(encoder.json|vocabulary) can need\)"):
            TextEncoder.load(str(tmp_path))
        os.remove(tmp_path / name)
        if name == "encoder.json":  # vocab.txt alone is read as plain
            assert TextEncoder.load(str(tmp_path)).vocab_size > 0


@pytest.mark.parametrize("kind", ["char", "word"])
def test_save_load_round_trip_with_awkward_tokens(tmp_path, kind):
    texts = ["中\u3000文 \t句子\\n\r\u2028结束\n新行", "Tab\tSep", "back\\slash \\u3000 literal"]
    enc = TextEncoder.build(texts, kind=kind, lowercase=True)
    enc.save(str(tmp_path))
    with open(tmp_path / "vocab.txt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[-1] == "" and len(lines) - 1 == enc.vocab_size  # one line per token
    assert all(ln and ln == ln.strip() for ln in lines[:-1])
    meta = json.loads((tmp_path / "encoder.json").read_text(encoding="utf-8"))
    assert meta["kind"] == kind and meta["lowercase"] is True
    assert meta["special_ids"]["pad"] == 0 and meta["special_tokens"]["eos"] == "[EOS]"
    for source in (str(tmp_path), str(tmp_path / "vocab.txt")):
        back = TextEncoder.load(source)
        assert back.tokens == enc.tokens and back.kind == kind and back.lowercase
        for t in texts:
            assert back.encode(back.tokenize(t)) == enc.encode(enc.tokenize(t))
            assert enc.unk_id not in enc.encode(enc.tokenize(t))


def test_escape_is_reversible():
    for token in ["\\", "\\u3000", "\u3000", "\t", "\n", " ", "a\\b", "\x00", "\u2029", "普通"]:
        assert unescape_token(escape_token(token)) == token
        assert "\n" not in escape_token(token)
    assert escape_token("普通") == "普通"  # ordinary tokens stay plain


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=8))
def test_any_text_round_trips_through_vocab_files(tmp_path_factory, texts):
    enc = TextEncoder.build(texts)
    out = tmp_path_factory.mktemp("v")
    enc.save(str(out))
    back = TextEncoder.load(str(out))
    assert back.tokens == enc.tokens
    assert all(unescape_token(escape_token(t)) == t for t in texts)


def test_plain_vocab_without_encoder_json_is_read_literally(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(list(SPECIAL_TOKENS) + ["\\t", "字"]) + "\n", encoding="utf-8")
    enc = TextEncoder.load(str(path))
    assert enc.kind == "char" and enc.tokens[6:] == ["\\t", "字"]


def test_load_errors(tmp_path):
    with pytest.raises(DataError, match="vocabulary file not found"):
        TextEncoder.load(str(tmp_path / "missing"))
    (tmp_path / "vocab.txt").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(DataError, match="must start with the special tokens"):
        TextEncoder.load(str(tmp_path))
    enc = TextEncoder.build(["abc"], kind="word")
    enc.save(str(tmp_path / "w"))
    with pytest.raises(DataError, match="saved as kind 'word'"):
        TextEncoder.load(str(tmp_path / "w"), kind="char")
    with open(tmp_path / "w" / "vocab.txt", "a", encoding="utf-8") as f:
        f.write("extra\n")
    with pytest.raises(DataError, match="different runs"):
        TextEncoder.load(str(tmp_path / "w"))
    (tmp_path / "dup").mkdir()
    (tmp_path / "dup" / "vocab.txt").write_text("\n".join(list(SPECIAL_TOKENS) + ["x", "x"]),
                                                encoding="utf-8")
    with pytest.raises(DataError, match="twice"):
        TextEncoder.load(str(tmp_path / "dup"))


def train_counts(cfg, corpus, pairs=False):
    """The train split's token counts, as the store build gives them to ``build_encoder``."""
    counting = TokenCounting.of(cfg, FORMATS[corpus.task].text_fields, pairs)
    return count_fields(corpus.splits["train"], counting)


def test_build_encoder_uses_train_split_only_and_reports_unk_per_split(tmp_path):
    def write(name, texts):
        p = tmp_path / name
        p.write_text("".join(json.dumps({"text": t, "label": 0}, ensure_ascii=False) + "\n"
                             for t in texts), encoding="utf-8")
        return str(p)

    cfg = load_config(data={"Data": {
        "corpus": "jsonl", "train_file": write("tr.jsonl", ["甲乙", "乙丙"]),
        "dev_file": write("dv.jsonl", ["甲丁"]), "test_file": write("te.jsonl", ["戊戊己甲"])}}).Data
    corpus = load_corpus(cfg)
    enc = build_encoder(cfg, train_counts(cfg, corpus))
    assert enc.tokens[6:] == ["乙", "丙", "甲"]  # 丁 戊 己 only in dev/test
    rates = {s: enc.unk_rate([enc.encode_text(ex["text"]) for ex in corpus.splits[s]])
             for s in ("train", "dev", "test")}
    assert rates == {"train": 0.0, "dev": 0.5, "test": 0.75}
    assert enc.stats["train_unk_rate"] == 0.0 and enc.stats["train_tokens"] == 4


def test_build_encoder_on_real_corpora_counts_only_train():
    cfg = load_config(data={"Data": {"corpus": "people_daily_ner"}}).Data
    corpus = load_corpus(cfg)
    enc = build_encoder(cfg, train_counts(cfg, corpus))
    assert enc.unk_rate(enc.encode(ex["tokens"]) for ex in corpus.splits["train"]) == 0.0
    assert 0.0 < enc.unk_rate(enc.encode(ex["tokens"]) for ex in corpus.splits["test"]) < 0.01
    assert enc.stats["train_tokens"] == sum(len(ex["tokens"]) for ex in corpus.splits["train"])


# ---------------------------------------------------------------- pretrained (PaddleNLP)

def _bert_vocab(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]", "中", "国", "人",
                               "ab", "##c"]) + "\n", encoding="utf-8")
    return str(path)


def test_pretrained_wraps_local_vocab_only(tmp_path):
    enc = TextEncoder.load(_bert_vocab(tmp_path), "pretrained", lowercase=True)
    assert enc.kind == "pretrained" and enc.vocab_size == 10
    assert (enc.pad_id, enc.cls_id, enc.sep_id, enc.unk_id) == (0, 1, 2, 3)  # read from the file
    assert enc.bos_id is None and enc.eos_id is None
    tokens = enc.tokenize("中国人ABC 好")
    assert tokens == ["中", "国", "人", "ab", "##c", "[UNK]"]
    assert enc.encode(tokens) == [5, 6, 7, 8, 9, 3]
    assert enc.encode(["中", "美"]) == [5, 3]  # tagging chars; unknown -> [UNK]
    out = tmp_path / "saved"
    enc.save(str(out))
    assert (out / "vocab.txt").read_text(encoding="utf-8") == \
        (tmp_path / "vocab.txt").read_text(encoding="utf-8")
    back = TextEncoder.load(str(out))
    assert back.kind == "pretrained" and back.special_ids == enc.special_ids


def test_pretrained_config_errors(tmp_path):
    cfg = load_config(data={"Data": {"corpus": "sentiment", "tokenizer": "pretrained",
                                     "limit": 5}}).Data
    corpus = load_corpus(cfg)
    with pytest.raises(ConfigError, match="Data.vocab_file"):
        build_encoder(cfg)
    cfg = load_config(data={"Data": {"corpus": "sentiment", "tokenizer": "pretrained", "limit": 5,
                                     "vocab_file": str(tmp_path / "nope.txt")}}).Data
    with pytest.raises(DataError, match="nope.txt: vocabulary file not found"):
        build_encoder(cfg)
    bad = tmp_path / "bad.txt"
    bad.write_text("中\n国\n[UNK]\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"lacks \['\[PAD\]', '\[CLS\]', '\[SEP\]'\]"):
        TextEncoder.load(str(bad), "pretrained")
    bad.write_text("[PAD]\n[CLS]\n[SEP]\n中\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"lacks \['\[UNK\]'\]"):
        TextEncoder.load(str(bad), "pretrained")
    assert os.path.exists(bad)


def test_seq2seq_vocab_covers_source_and_target(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text('{"source": "中国", "target": "zg"}\n' * 3, encoding="utf-8")
    cfg = load_config(data={"Data": {"corpus": "jsonl", "train_file": str(p)}}).Data
    enc = build_encoder(cfg, train_counts(cfg, load_corpus(cfg), True), pairs=True)  # seq2seq
    assert set(enc.tokens[6:]) == {"中", "国", "z", "g"}
    # the target alphabet comes first: the decoder's output layer covers ids < output_size
    assert enc.output_size == 8 and set(enc.tokens[6:8]) == {"z", "g"}


def pair_counts(sources, targets, target_kind, kind="char"):
    """The (source, target) token counts ``TextEncoder.build_seq2seq`` takes."""
    src = TokenCounting(kind, False, ((("source",), None),))
    tgt = TokenCounting(kind, False, ((("target",), target_kind),))
    return (count_fields([{"source": t} for t in sources], src)[0],
            count_fields([{"target": t} for t in targets], tgt)[0])


def test_seq2seq_vocab_target_first_round_trip_and_unk(tmp_path):
    sources = ["中国人", "中国", "国人 a"]
    targets = ["zhong guo ren", "zhong guo", "guo ren a"]
    enc = TextEncoder.build_seq2seq(*pair_counts(sources, targets, "word"), "char",
                                    target_kind="word")
    assert enc.output_size == 6 + 4  # zhong guo ren a: "a" is also a source char, counted once
    assert set(enc.tokens[6:10]) == {"zhong", "guo", "ren", "a"}
    assert all(enc.encode_target(t) == [enc.tokens.index(w) for w in t.split()] for t in targets)
    ids = enc.encode_target("zhong 中 xyz")  # a source-only token and an unseen one -> [UNK]
    assert ids == [enc.tokens.index("zhong"), enc.unk_id, enc.unk_id]
    assert enc.decode_target(enc.encode_target("guo ren")) == "guo ren"
    enc.save(tmp_path)
    back = TextEncoder.load(tmp_path)
    assert (back.output_size, back.target_kind, back.tokens) == (10, "word", enc.tokens)
    letters = TextEncoder.build_seq2seq(*pair_counts(sources, targets, "char"), "char")  # spaces too
    assert letters.decode_target(letters.encode_target("guo ren")) == "guo ren"
    assert set(letters.tokens[6:letters.output_size]) == set("zhonguremia ") - {"m", "i"}
    meta = json.load(open(tmp_path / "encoder.json"))
    meta["output_size"] = 99999
    json.dump(meta, open(tmp_path / "encoder.json", "w"))
    with pytest.raises(DataError, match="output_size 99999 must be an integer"):
        TextEncoder.load(tmp_path)


def test_vocab_file_without_pretrained_is_a_config_error():
    cfg = load_config(data={"Data": {"corpus": "sentiment", "limit": 5, "vocab_file": "v.txt"}}).Data
    with pytest.raises(ConfigError, match="Data.vocab_file is read only with Data.tokenizer"):
        build_encoder(cfg)
