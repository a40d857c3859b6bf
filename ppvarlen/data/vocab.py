"""Text -> token ids: vocabularies behind one protocol (``Vocabulary``): ``TextEncoder`` (a char
/ word vocabulary built from the train split; a seq2seq one holds its target alphabet first)
and ``PretrainedTokenizer`` (a PaddleNLP tokenizer over a local vocab.txt).  ``Vocabulary.load``
(also reached as ``TextEncoder.load``) reads either from its files.

Built from the train split only (so dev/test UNK rates are honest), saved as a plain
``vocab.txt`` (line number = id) plus ``encoder.json`` (kind, lowercase, special
tokens), and loaded back identically.  The special ids are fixed:
[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [BOS]=4 [EOS]=5.

Whitespace in char mode: a space, U+3000 or tab inside a text is a real character of
the review, so it is a token like any other.  To keep vocab.txt one token per line,
such tokens are written escaped (``\\u3000``, ``\\t``; a backslash itself as ``\\\\``);
``encoder.json`` records the escaping, so a vocab.txt without it (e.g. a BERT vocab)
is read literally.
"""
import hashlib
import json
import os
import re
import tempfile
import unicodedata
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..config import ConfigError
from ..utils.io import atomic_write_json, atomic_write_text, read_bounded
from ..utils.log import get_logger
from .errors import DataError

logger = get_logger("data.vocab")
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[BOS]", "[EOS]")
PAD, UNK, CLS, SEP, BOS, EOS = SPECIAL_TOKENS
KINDS = ("char", "word", "pretrained")
ENCODER_FORMAT = 1
# vocab.txt and encoder.json are read whole into memory: a vocabulary of millions of tokens
# is tens of MB; a larger file (a crafted export's) is refused before it is read
MAX_FILE_BYTES = 256 << 20
# what PaddleNLP's save_pretrained writes for a WordPiece tokenizer besides vocab.txt
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
_UNESCAPE_RE = re.compile(r"\\(\\|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})")


def escape_token(token):
    out = []
    for c in token:
        if c == "\\":
            out.append("\\\\")
        # whitespace, controls, format chars, separators, surrogates: invisible or line-breaking
        elif c.isspace() or unicodedata.category(c)[0] in "CZ":
            out.append(f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
        else:
            out.append(c)
    return "".join(out)


def unescape_token(text):
    return _UNESCAPE_RE.sub(lambda m: "\\" if m.group(1) == "\\" else chr(int(m.group(1)[1:], 16)),
                            text)


def char_spans(text, tokens, lowercase=False):
    """(start, end) of each token in ``text``, found left to right.

    Word pieces lose their ``##``; a token that cannot be found (a normalised or
    unknown form) gets the next character so offsets stay monotonic.
    """
    hay = text.lower() if lowercase else text
    spans, pos = [], 0
    for tok in tokens:
        piece = tok[2:] if tok.startswith("##") and len(tok) > 2 else tok
        piece = piece.lower() if lowercase else piece
        at = hay.find(piece, pos)
        if at < 0 or (piece.strip() and hay[pos:at].strip()):
            # not found, or found only after skipping real text: do not jump ahead
            at, piece = min(pos, len(text)), text[pos:pos + 1] or " "
        spans.append((at, min(at + len(piece), len(text))))
        pos = at + len(piece)
    return spans


class Vocabulary:
    """What every vocabulary does (the protocol the tasks, the store build, the predictor and
    the doctor use): ``tokenize`` / ``encode`` / ``encode_array`` / ``decode``, ``vocab_size``,
    the special ids, ``save`` and ``Vocabulary.load``; ``TextEncoder`` and
    ``PretrainedTokenizer`` implement it (the module's docstring says how they differ)."""

    kind = ""
    auto_tokenizer = False  # a PaddleNLP AutoTokenizer directory (tokenizer_config.json)
    # seq2seq: ids < output_size are the tokens a decoder may generate (the train targets'
    # tokens come first in the vocabulary); None = every id (classification, tagging)
    output_size = None
    # seq2seq: how targets split into tokens ("char" letters or "word" = whitespace-separated
    # units such as pinyin syllables); None = like the source (``kind``)
    target_kind = None

    def __init__(self, lowercase):
        self.lowercase = lowercase
        self.stats = {}  # filled by build(): counts behind the vocabulary

    @property
    def special_ids(self):
        return {"pad": self.pad_id, "unk": self.unk_id, "cls": self.cls_id, "sep": self.sep_id,
                "bos": self.bos_id, "eos": self.eos_id}

    def normalize(self, tokens):
        """Given tokens (tagging data) -> the tokens this vocabulary looks up."""
        return [t.lower() for t in tokens] if self.lowercase else list(tokens)

    def encode(self, tokens):
        """Tokens -> ids; unknown tokens (and, in a ``TextEncoder``, literal special-token
        strings) -> unk_id."""
        ids, unk = self._ids, self.unk_id
        return [ids.get(t, unk) for t in self.normalize(tokens)]

    def encode_text(self, text):
        return self.encode(self.tokenize(text))

    def encode_array(self, text):
        """``encode(tokenize(text))`` as an int32 numpy array."""
        return np.asarray(self.encode_text(text), np.int32)

    def encode_batch(self, texts):
        """``encode_array`` of each of ``texts`` -> (the ids one after the other (int32), each
        text's count of ids (int64))."""
        ids = [self.encode_text(t) for t in texts]
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        return np.array([i for row in ids for i in row], np.int32), lengths

    def encode_target(self, text):
        """Target text -> ids a decoder can produce (a token outside the output alphabet ->
        [UNK]); targets split per ``target_kind``."""
        kind = self.target_kind or self.kind
        ids = self.encode(list(text) if kind == "char" else text.split())  # encode lowercases
        limit = self.vocab_size if self.output_size is None else self.output_size
        return [i if i < limit else self.unk_id for i in ids]

    def decode_target(self, ids):
        """Generated ids (no BOS/EOS) -> target text: chars joined with "", words with " "."""
        return ("" if (self.target_kind or self.kind) == "char" else " ").join(self.decode(ids))

    def unk_rate(self, id_lists):
        """Share of [UNK] among real tokens (pad/cls/sep/bos/eos not counted)."""
        special = {self.pad_id, self.cls_id, self.sep_id, self.bos_id, self.eos_id} - {None}
        real = [i for ids in id_lists for i in map(int, ids) if i not in special]
        return real.count(self.unk_id) / len(real) if real else 0.0

    # ------------------------------------------------------------ files

    def save(self, directory):
        """Write ``vocab.txt`` + ``encoder.json`` into ``directory`` (atomic per file)."""
        os.makedirs(directory, exist_ok=True)
        names = dict(zip(("pad", "unk", "cls", "sep", "bos", "eos"), SPECIAL_TOKENS))
        meta = {"format_version": ENCODER_FORMAT, "kind": self.kind, "lowercase": self.lowercase,
                "vocab_size": self.vocab_size,
                "special_tokens": {k: names[k] for k, i in self.special_ids.items() if i is not None},
                "special_ids": self.special_ids}
        if self.output_size is not None:
            meta["output_size"] = self.output_size
            meta["target_kind"] = self.target_kind or self.kind
        text = self._vocab_text(directory, meta)
        atomic_write_text(os.path.join(directory, "vocab.txt"), text)
        atomic_write_json(os.path.join(directory, "encoder.json"), meta)

    def save_pretrained_tokenizer(self, directory):
        raise ConfigError("only a pretrained tokenizer (Data.tokenizer: pretrained) can be "
                          "saved in PaddleNLP's format")

    @classmethod
    def load(cls, dir_or_file, kind=None, lowercase=None):
        """Load from a directory (vocab.txt + encoder.json) or a vocab.txt file: a
        ``TextEncoder``, or a ``PretrainedTokenizer`` for kind ``pretrained``.

        ``kind``/``lowercase`` default to encoder.json's; without encoder.json, kind
        defaults to char (pretrained for a BERT/ERNIE vocab must be asked for).
        """
        path = os.fspath(dir_or_file)
        vocab_path = os.path.join(path, "vocab.txt") if os.path.isdir(path) else path
        if not os.path.isfile(vocab_path):
            raise DataError(f"{vocab_path}: vocabulary file not found; give the directory holding "
                            f"vocab.txt (a checkpoint or export dir) or the vocab.txt path itself "
                            f"(Data.vocab_file for tokenizer: pretrained)")
        meta_path = os.path.join(os.path.dirname(os.path.abspath(vocab_path)), "encoder.json")
        meta = {}
        if os.path.isfile(meta_path):
            try:
                meta = json.loads(read_bounded(meta_path, MAX_FILE_BYTES,
                                               "an encoder.json").decode("utf-8"))
            except OSError as e:
                raise DataError(f"{meta_path}: cannot be read ({e.strerror})") from None
            except (ValueError, UnicodeDecodeError) as e:
                raise DataError(f"{meta_path}: not valid JSON ({e}); re-save the model or "
                                f"delete encoder.json to read vocab.txt as plain") from None
            if not isinstance(meta, dict):
                raise DataError(f"{meta_path}: must be a JSON object (kind, lowercase, "
                                f"vocab_size, ...), got {type(meta).__name__}; re-save the model "
                                f"or delete encoder.json to read vocab.txt as plain")
        saved_kind = meta.get("kind")
        if kind is not None and saved_kind is not None and kind != saved_kind:
            raise DataError(f"{meta_path}: vocabulary was saved as kind {saved_kind!r} but "
                            f"{kind!r} was asked for; set Data.tokenizer: {saved_kind}")
        kind = kind or saved_kind or "char"
        if kind not in KINDS:
            raise ConfigError(f"Data.tokenizer: {kind!r} is not one of {list(KINDS)}")
        lowercase = meta.get("lowercase", False) if lowercase is None else lowercase
        try:
            text = read_bounded(vocab_path, MAX_FILE_BYTES, "a vocabulary").decode("utf-8")
            # newlines read as "\n" ("\r\n" too), as a text-mode read gave them
            lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        except OSError as e:
            raise DataError(f"{vocab_path}: cannot be read ({e.strerror})") from None
        except UnicodeDecodeError as e:
            raise DataError(f"{vocab_path}: not valid UTF-8 ({e}); re-save it as UTF-8") from None
        if kind == "pretrained":
            return PretrainedTokenizer.from_vocab_file(vocab_path, lines, lowercase)
        return TextEncoder.from_files(vocab_path, lines, meta_path, meta, kind, lowercase)


class TextEncoder(Vocabulary):
    """A char / word vocabulary (``kind``: ``char``, every character a token (Chinese), or
    ``word``, whitespace split), built from the train split (``build``; a seq2seq vocabulary
    with its target alphabet first: ``build_seq2seq``) or loaded (``Vocabulary.load``)."""

    def __init__(self, tokens, kind="char", lowercase=False):
        if kind not in ("char", "word"):
            if kind in KINDS:
                raise ConfigError("Data.tokenizer: pretrained vocabularies are loaded from "
                                  "Data.vocab_file (Vocabulary.load(path, 'pretrained')), not "
                                  "listed")
            raise ConfigError(f"Data.tokenizer: {kind!r} is not one of {list(KINDS)}")
        super().__init__(lowercase)
        self.kind = kind
        self.tokens = list(tokens)
        if tuple(self.tokens[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise DataError(f"vocabulary must start with the special tokens "
                            f"{list(SPECIAL_TOKENS)} (ids 0-5), got {self.tokens[:6]}")
        if len(set(self.tokens)) != len(self.tokens):
            dup = next(t for t, c in Counter(self.tokens).items() if c > 1)
            raise DataError(f"vocabulary lists token {dup!r} twice; each token needs one id")
        # Text never yields a special id: a literal "[SEP]" in user text is [UNK],
        # so data cannot inject structure tokens.
        self._ids = {t: i for i, t in enumerate(self.tokens) if i >= len(SPECIAL_TOKENS)}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.bos_id, self.eos_id = range(6)
        self._char_table = None  # encode_array: codepoint -> id

    # ------------------------------------------------------------ building

    @classmethod
    def build(cls, texts, kind="char", lowercase=False, min_freq=1, max_size=None):
        """Vocabulary from ``texts`` (strings, or token lists for tagging data; or a Counter of
        tokens already counted, ``count_fields``).

        Tokens seen fewer than ``min_freq`` times are left out; ``max_size`` caps the
        vocab size including the 6 special tokens.  Order: frequency desc, then token,
        so the same data gives the same ids in every process.
        """
        if kind == "pretrained":
            raise ConfigError("Data.tokenizer: pretrained vocabularies are loaded from "
                              "Data.vocab_file, not built; use TextEncoder.load(path, 'pretrained')")
        if min_freq < 1:
            raise ConfigError(f"Data.min_freq: {min_freq} must be >= 1")
        if max_size is not None and max_size <= len(SPECIAL_TOKENS):
            raise ConfigError(f"Data.max_size: {max_size} leaves no room beyond the "
                              f"{len(SPECIAL_TOKENS)} special tokens; use a larger value or null")
        counts = texts if isinstance(texts, Counter) else cls.token_counts(texts, kind, lowercase)
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        kept = [t for t, c in ranked if c >= min_freq]
        below_min = len(ranked) - len(kept)
        if max_size is not None:
            kept = kept[:max_size - len(SPECIAL_TOKENS)]
        enc = cls(list(SPECIAL_TOKENS) + kept, kind, lowercase)
        total = sum(counts.values())
        covered = sum(counts[t] for t in kept)
        enc.stats = {"kind": kind, "lowercase": lowercase, "min_freq": min_freq,
                     "max_size": max_size, "vocab_size": enc.vocab_size,
                     "train_tokens": total, "train_types": len(counts),
                     "types_below_min_freq": below_min,
                     "types_over_max_size": len(ranked) - below_min - len(kept),
                     "train_unk_rate": (total - covered) / total if total else 0.0}
        return enc

    @classmethod
    def token_counts(cls, texts, kind, lowercase):
        """Counter of the tokens of ``texts`` (strings, or token lists) as a ``kind``
        vocabulary tokenizes them; a literal special-token string is not counted."""
        probe = cls(SPECIAL_TOKENS, kind, lowercase)
        counts = Counter()
        plain = []  # char-level texts without lowercasing: counted as one string (in C)
        for item in texts:
            if isinstance(item, str) and kind == "char" and not lowercase:
                plain.append(item)
            else:
                counts.update(probe.tokenize(item) if isinstance(item, str)
                              else probe.normalize(item))
        if plain:  # a histogram of codepoints: the C Counter is a dict update per character
            codes = np.frombuffer("".join(plain).encode("utf-32-le", "surrogatepass"), np.uint32)
            hist = np.bincount(codes)
            seen = np.flatnonzero(hist)
            counts.update(dict(zip(map(chr, seen.tolist()), hist[seen].tolist())))
        for t in SPECIAL_TOKENS:
            counts.pop(t, None)  # a literal "[CLS]" in text is not the special token
        return counts

    @classmethod
    def build_seq2seq(cls, source_counts, target_counts, kind="char", lowercase=False,
                      min_freq=1, max_size=None, target_kind=None):
        """One vocabulary for both sides, the train targets' tokens first; the counts are
        ``count_fields``' (``TokenCounting.of(..., pairs=True)``: the targets split by the
        target tokenizer).

        The decoder's output layer then covers only ids < ``output_size`` (the specials and
        the target alphabet: ~40 symbols for pinyin instead of ~4,600 source characters),
        which is most of a training step's cost otherwise.  Within each group the order is
        ``build``'s (frequency desc, then token).
        """
        if not isinstance(source_counts, Counter) or not isinstance(target_counts, Counter):
            raise TypeError("build_seq2seq takes the two sides' token counts (count_fields)")
        enc = cls.build(source_counts + target_counts, kind, lowercase, min_freq, max_size)
        kept = enc.tokens[len(SPECIAL_TOKENS):]
        first = [t for t in kept if t in target_counts]
        out = cls(list(SPECIAL_TOKENS) + first + [t for t in kept if t not in target_counts],
                  kind, lowercase)
        out.output_size = len(SPECIAL_TOKENS) + len(first)
        out.target_kind = target_kind or kind
        out.stats = dict(enc.stats, output_size=out.output_size)
        return out

    # ------------------------------------------------------------ text <-> ids

    @property
    def vocab_size(self):
        return len(self.tokens)

    def tokenize(self, text):
        if self.lowercase:
            text = text.lower()
        return list(text) if self.kind == "char" else text.split()

    def encode_batch(self, texts):
        """``Vocabulary.encode_batch``: for a char vocabulary without lowercasing, the texts'
        ids are ``encode_array`` of the texts joined (a char is a codepoint, so a text's ids are
        as many as its ``len``)."""
        if self.kind != "char" or self.lowercase:
            return super().encode_batch(texts)
        return self.encode_array("".join(texts)), np.fromiter(map(len, texts), np.int64,
                                                              len(texts))

    def encode_array(self, text):
        """``Vocabulary.encode_array``; for a char vocabulary without lowercasing one codepoint
        table lookup (the corpus-encoding hot path)."""
        if self.kind != "char" or self.lowercase:
            return super().encode_array(text)
        if self._char_table is None:  # codepoint -> id, made on first use
            table = np.full(0x110000, self.unk_id, np.int32)
            for token, i in self._ids.items():
                if len(token) == 1:
                    table[ord(token)] = i
            self._char_table = table
        return self._char_table[np.frombuffer(text.encode("utf-32-le", "surrogatepass"),
                                              np.uint32)]

    def decode(self, ids, skip_special=False):
        """Ids -> tokens (a list; join them as your task needs: "" for char, " " for word)."""
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < len(self.tokens)), None)
        if bad is not None:
            raise DataError(f"id {bad} is outside the vocabulary (size {len(self.tokens)})")
        skip = set(range(len(SPECIAL_TOKENS))) - {self.unk_id} if skip_special else ()
        return [self.tokens[i] for i in ids if i not in skip]

    # ------------------------------------------------------------ files

    def _vocab_text(self, directory, meta):
        meta["vocab_escape"] = "backslash"
        return "".join(escape_token(t) + "\n" for t in self.tokens)

    @classmethod
    def from_files(cls, vocab_path, lines, meta_path, meta, kind, lowercase):
        """What ``save`` wrote (``lines``: vocab.txt's; ``meta``: encoder.json's, or {})."""
        if lines[-1] == "":
            lines.pop()
        if meta.get("vocab_escape") == "backslash":
            lines = [unescape_token(t) for t in lines]
        for n, t in enumerate(lines, 1):
            if t == "":
                raise DataError(f"{vocab_path}:{n}: empty line; one token per line, no blanks")
        enc = cls(lines, kind, lowercase)
        if meta.get("vocab_size") not in (None, enc.vocab_size):
            raise DataError(f"{vocab_path}: holds {enc.vocab_size} tokens but {meta_path} says "
                            f"{meta['vocab_size']}; the two files come from different runs")
        output_size, target_kind = meta.get("output_size"), meta.get("target_kind")
        if output_size is not None and not (isinstance(output_size, int)
                                            and len(SPECIAL_TOKENS) <= output_size <= enc.vocab_size):
            raise DataError(f"{meta_path}: output_size {output_size!r} must be an integer in "
                            f"[{len(SPECIAL_TOKENS)}, {enc.vocab_size}]; re-save the model")
        if target_kind not in (None, "char", "word"):
            raise DataError(f"{meta_path}: target_kind {target_kind!r} must be char or word")
        enc.output_size, enc.target_kind = output_size, target_kind
        return enc


class PretrainedTokenizer(Vocabulary):
    """A PaddleNLP WordPiece tokenizer (``kind`` ``pretrained``) built from local files only
    (never a model name that could download); only this path imports paddlenlp.  A vocab.txt
    with a ``tokenizer_config.json`` beside it (a PaddleNLP ``save_pretrained`` directory) is read
    with ``AutoTokenizer`` and that file decides the tokenizer class and its options
    (do_lower_case, tokenize_chinese_chars, ...); ``save`` copies the tokenizer files
    (``TOKENIZER_FILES``) next to vocab.txt, so a checkpoint or export tokenizes exactly like
    ``AutoTokenizer`` on the directory.  A bare vocab.txt gets
    ``ErnieTokenizer(do_lower_case=Data.lowercase)``.  Its special ids are the file's; it has no
    [BOS]/[EOS]."""

    kind = "pretrained"

    def __init__(self, tok, lowercase, auto_tokenizer=False):
        super().__init__(lowercase)
        self._tok = tok
        self.auto_tokenizer = auto_tokenizer
        self.tokens = []  # the token list is the tokenizer's (``vocab_sha256`` hashes this one)
        vocab = tok.vocab
        self._ids = vocab.token_to_idx
        self.pad_id, self.unk_id, self.cls_id, self.sep_id = (
            vocab.to_indices(t) for t in (PAD, UNK, CLS, SEP))
        self.bos_id = self.eos_id = None  # BERT/ERNIE vocabularies have no [BOS]/[EOS]

    @property
    def vocab_size(self):
        return len(self._tok.vocab)

    def tokenize(self, text):
        return self._tok.tokenize(text)

    def decode(self, ids, skip_special=False):
        special = {self.pad_id, self.cls_id, self.sep_id} if skip_special else set()
        return [t for i, t in zip(ids, self._tok.convert_ids_to_tokens([int(i) for i in ids]))
                if int(i) not in special]

    def _vocab_text(self, directory, meta):
        meta.update(vocab_escape=None, tokenizer_class=type(self._tok).__name__,
                    tokenizer_files=self._write_tokenizer_files(directory))
        # verbatim: it is someone else's vocab
        return "".join(self._tok.vocab.to_tokens(i) + "\n" for i in range(self.vocab_size))

    def _write_tokenizer_files(self, directory):
        """An AutoTokenizer's files (not vocab.txt: ``save`` writes it) -> names written."""
        if not self.auto_tokenizer:
            return []
        with tempfile.TemporaryDirectory() as tmp:
            self._tok.save_pretrained(tmp)
            written = [n for n in TOKENIZER_FILES if os.path.isfile(os.path.join(tmp, n))]
            for name in written:
                with open(os.path.join(tmp, name), encoding="utf-8") as f:
                    atomic_write_text(os.path.join(directory, name), f.read())
        return written

    def save_pretrained_tokenizer(self, directory):
        """The tokenizer as PaddleNLP's ``save_pretrained`` writes it (vocab.txt,
        tokenizer_config.json, ...): ``AutoTokenizer.from_pretrained(directory)`` reads it."""
        self._tok.save_pretrained(directory)

    @classmethod
    def from_vocab_file(cls, vocab_path, lines, lowercase):
        """The tokenizer over ``vocab_path`` (``lines``: its lines)."""
        # Check the file first: PaddleNLP asserts (a bare traceback) on a missing [UNK].
        missing = [t for t in (PAD, UNK, CLS, SEP) if t not in lines]
        if missing:
            raise DataError(f"{vocab_path}: pretrained vocab lacks {missing}; a BERT/ERNIE "
                            f"vocab.txt lists [PAD], [UNK], [CLS] and [SEP]")
        from paddlenlp.transformers import AutoTokenizer, ErnieTokenizer  # heavy: only here

        directory = os.path.dirname(os.path.abspath(vocab_path))
        if not os.path.isfile(os.path.join(directory, "tokenizer_config.json")):
            return cls(ErnieTokenizer(vocab_file=vocab_path, do_lower_case=lowercase), lowercase)
        try:  # local JSON + vocab files; nothing downloaded
            tok = AutoTokenizer.from_pretrained(directory, from_hf_hub=False, from_aistudio=False)
        except (OSError, ValueError, KeyError, AssertionError) as e:
            raise DataError(f"{directory}/tokenizer_config.json: PaddleNLP's AutoTokenizer cannot "
                            f"load this directory ({e})") from None
        if not hasattr(getattr(tok, "vocab", None), "token_to_idx"):
            raise DataError(f"{directory}: {type(tok).__name__} has no WordPiece vocabulary "
                            f"(vocab.txt); ppvarlen reads BERT/ERNIE-style tokenizers")
        do_lower = bool(getattr(tok, "do_lower_case", False))
        if lowercase and not do_lower:
            raise ConfigError(f"Data.lowercase: true, but {directory}/tokenizer_config.json "
                              f"says do_lower_case: false, and that file decides how this "
                              f"tokenizer works; remove Data.lowercase")
        return cls(tok, do_lower, auto_tokenizer=True)


def vocab_sha256(encoder):
    """Fingerprint of the token list (id order matters: it is the embedding's row order)."""
    return hashlib.sha256("\n".join(encoder.tokens).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TokenCounting:
    """What a vocabulary counts of an example: per group, the fields (a string, or a token
    list) and how a string is cut first (None: as the vocabulary tokenizes; a seq2seq target:
    by ``Data.target_tokenizer``, its pieces then counted as tokens)."""

    kind: str
    lowercase: bool
    groups: tuple  # ((fields, cut_by), ...)

    @classmethod
    def of(cls, data_cfg, text_fields, pairs=False):
        """The counting of a corpus format's ``text_fields``; ``pairs``: the first field's
        texts and the second's (seq2seq) counted apart, for ``TextEncoder.build_seq2seq``."""
        if not pairs:
            return cls(data_cfg.tokenizer, data_cfg.lowercase, ((tuple(text_fields), None),))
        target_kind = data_cfg.get("target_tokenizer") or data_cfg.tokenizer
        if target_kind not in ("char", "word"):
            raise ConfigError(f"Data.target_tokenizer: {target_kind!r} must be char or word")
        source, target = text_fields
        return cls(data_cfg.tokenizer, data_cfg.lowercase,
                   (((source,), None), ((target,), target_kind)))


def count_fields(examples, counting):
    """The token counts of ``examples`` -> one Counter per group of ``counting``."""
    out = []
    for fields, cut_by in counting.groups:
        items = [ex[f] for ex in examples for f in fields]
        if cut_by is not None:
            probe = TextEncoder(SPECIAL_TOKENS, cut_by, counting.lowercase)
            items = [probe.tokenize(t) for t in items]
        out.append(TextEncoder.token_counts(items, counting.kind, counting.lowercase))
    return tuple(out)


def build_encoder(data_cfg, counts=None, pairs=False):
    """The encoder ``Data`` asks for: loaded from ``Data.vocab_file`` (pretrained) or built
    from the train split's token ``counts`` (``count_fields``; ``encoder.stats``: the counts
    behind it, train UNK rate); ``pairs``: one vocabulary over sources and targets (the task
    says so).  The UNK rate of every split is measured where the splits are encoded."""
    if data_cfg.vocab_file and data_cfg.tokenizer != "pretrained":
        raise ConfigError(f"Data.vocab_file is read only with Data.tokenizer: pretrained (here "
                          f"{data_cfg.tokenizer!r}, whose vocabulary is built from the train "
                          f"split); remove Data.vocab_file or set tokenizer: pretrained")
    if data_cfg.tokenizer == "pretrained":
        if not data_cfg.vocab_file:
            raise ConfigError("Data.vocab_file: tokenizer: pretrained needs a local BERT/ERNIE "
                              "vocab.txt (nothing is downloaded); set Data.vocab_file")
        enc = TextEncoder.load(data_cfg.vocab_file, "pretrained", data_cfg.lowercase)
        enc.stats = {"kind": "pretrained", "vocab_file": data_cfg.vocab_file,
                     "vocab_size": enc.vocab_size}
        return enc
    options = (data_cfg.tokenizer, data_cfg.lowercase, data_cfg.min_freq, data_cfg.max_size)
    if pairs:  # counts: the sources' and the targets'
        enc = TextEncoder.build_seq2seq(*counts, *options, data_cfg.get("target_tokenizer"))
    else:
        enc = TextEncoder.build(counts[0], *options)
    logger.info("vocabulary: %s, %d tokens from the train split (%d types, min_freq %d)",
                enc.kind, enc.vocab_size, enc.stats["train_types"], data_cfg.min_freq)
    return enc
