"""Tag schemes of sequence tagging: which one a tag set uses, which tags and sequences fit it,
and the chunks (entities, words) a tag sequence encodes.  Plain Python (no paddle, no numpy).

Schemes (a tag is ``O``, ``P-TYPE`` or a bare prefix ``P``; an untyped chunk has type "" here,
``null`` in a served answer):
- ``bio``   (IOB2): B begins a chunk, I continues it.
- ``bioes`` (IOBES): B begins, I continues, E ends a chunk, S is a one-token chunk.
- ``bmes``: like BIOES with M for "middle" (word segmentation: B M E S, no O; Chinese NER
  corpora add O).
- ``plain``: every token has its own label (POS tags ...): no chunks, token accuracy only.

Chunks follow conlleval's rules, extended to E/S the way seqeval's default mode does:
an ill-formed sequence is read, not rejected -- an I/E/M that does not continue a chunk of
its type (after O, after E/S, after another type) starts a new chunk, and a chunk ends
where the next tag cannot continue it.  For BIO these are exactly conlleval's rules.
"""
import functools
from dataclasses import dataclass

OUTSIDE = "O"


@dataclass(frozen=True)
class Scheme:
    name: str
    prefixes: str       # chunk prefixes in label order ("" for plain: no chunks; O is allowed
                        # in every chunk scheme)
    inside: str = ""    # the prefix that continues a chunk
    closed: bool = False  # every chunk must end with E (or be one S): well-formedness checkable

    @property
    def has_chunks(self):
        return bool(self.prefixes)


SCHEME = {
    "bio": Scheme("bio", "BI", "I"),
    "bioes": Scheme("bioes", "BIES", "I", closed=True),
    "bmes": Scheme("bmes", "BMES", "M", closed=True),
    "plain": Scheme("plain", ""),
}
CHUNK_PREFIXES = set("BIEMS")


def split_tag(tag):
    """``"B-PER"`` -> ("B", "PER"); ``"B"`` -> ("B", ""); ``"O"`` -> ("O", ""); a tag of no
    chunk shape (``"NN"``, ``"X-LOC"``, ``"B-"``) -> None."""
    if tag == OUTSIDE:
        return OUTSIDE, ""
    if len(tag) == 1 and tag in CHUNK_PREFIXES:
        return tag, ""
    if len(tag) > 2 and tag[0] in CHUNK_PREFIXES and tag[1] == "-":
        return tag[0], tag[2:]
    return None


def fits(tag, scheme):
    """Whether ``tag`` is a tag of ``scheme`` (a name)."""
    s = SCHEME[scheme]
    if not s.has_chunks:
        return bool(tag) and not any(c.isspace() for c in tag)
    parts = split_tag(tag)
    return parts is not None and (parts[0] in s.prefixes or parts[0] == OUTSIDE)


def expected_tags(scheme):
    """What the tags of ``scheme`` look like, for error messages."""
    s = SCHEME[scheme]
    if not s.has_chunks:
        return "any tag without spaces (plain per-token labels such as POS tags)"
    shapes = ", ".join(f"{p}-TYPE" for p in s.prefixes)
    return f"one of O, {shapes}, or untyped {', '.join(s.prefixes)}"


def detect(tags):
    """The scheme a set of tags uses, or raise ValueError saying which tags mix schemes.

    Tags that are not chunk-shaped make the set plain, unless typed chunk tags (``B-PER``)
    are there too (mixed).  Among chunk tags: M -> bmes, E or S -> bioes, else bio; I and M
    together are mixed (BIOES/BIO's "inside" and BMES's "middle").
    """
    tags = set(tags)
    parts = {t: split_tag(t) for t in tags}
    other = sorted(t for t, p in parts.items() if p is None)
    if other:
        typed = sorted(t for t, p in parts.items() if p is not None and p[1])
        if typed:
            raise ValueError(f"chunk tags ({', '.join(typed[:3])}) and plain tags "
                             f"({', '.join(other[:3])}) are mixed")
        return "plain"
    prefixes = {p[0] for p in parts.values()}
    if "M" in prefixes and "I" in prefixes:
        inside = sorted(t for t, p in parts.items() if p[0] == "I")[:2]
        middle = sorted(t for t, p in parts.items() if p[0] == "M")[:2]
        raise ValueError(f"BIO/BIOES inside tags ({', '.join(inside)}) and BMES middle tags "
                         f"({', '.join(middle)}) are mixed")
    if "M" in prefixes:
        return "bmes"
    if prefixes & {"E", "S"}:
        return "bioes"
    return "bio"


def complete(tags, scheme):
    """The tags a chunk ``scheme`` needs so that ``detect`` finds it in them again: e.g. a BMES
    corpus without three-token words has no M tag and would read as BIOES.  Returns the tags
    to add, in label order (``order``)."""
    if not SCHEME[scheme].has_chunks or detect(tags) == scheme:
        return []
    types = {split_tag(t)[1] for t in tags if split_tag(t) and split_tag(t)[0] != OUTSIDE} or {""}
    full = {f"{p}-{t}" if t else p for t in types for p in SCHEME[scheme].prefixes}
    return order(full - set(tags), scheme)


def order(tags, scheme):
    """Label order: O first, then by type with the scheme's prefixes in order (B I E S);
    plain tags sorted."""
    prefixes = SCHEME[scheme].prefixes
    if not prefixes:
        return sorted(tags)
    rest = sorted((t for t in tags if t != OUTSIDE),
                  key=lambda t: (split_tag(t)[1], prefixes.index(split_tag(t)[0])))
    return ([OUTSIDE] if OUTSIDE in tags else []) + rest


def sequence_problem(tags, scheme):
    """Why ``tags`` is not a sequence of ``scheme``, or None.

    A tag outside the scheme is always a problem.  BIOES/BMES sequences must also be well
    formed (every chunk B (I|M)* E or S), which tells a BIO line in a BIOES file; BIO accepts
    an I after O (IOB1 writes chunks that way; it reads as a chunk start).
    """
    for i, tag in enumerate(tags):
        if not fits(tag, scheme):
            return f"tag {i} {tag!r} is not a {scheme.upper()} tag ({expected_tags(scheme)})"
    if not SCHEME[scheme].closed:
        return None
    inside, open_type = SCHEME[scheme].inside, None  # open_type: type of the chunk being read
    shape = f"a {scheme.upper()} chunk is B {inside}* E or S"
    unclosed = f"is not closed by E-/S-; {shape} (is this line BIO?)"
    for i, tag in enumerate(tags):
        prefix, etype = split_tag(tag)
        continues = prefix in (inside, "E")
        if continues and open_type != etype:
            return (f"tag {i} {tag!r} does not continue a chunk (after "
                    f"{tags[i - 1] if i else 'the start'!r}); {shape}")
        if not continues and open_type is not None:
            return f"the chunk ending at tag {i - 1} ({tags[i - 1]!r}) {unclosed}"
        open_type = etype if prefix in ("B", inside) else None
    if open_type is not None:
        return f"the last chunk ({tags[-1]!r}) {unclosed}"
    return None


def _ends(prev, prev_type, cur, cur_type):
    """conlleval's endOfChunk, with S (seqeval): does the chunk before ``cur`` end here?"""
    return (prev in ("E", "S")
            or prev in ("B", "I") and cur in ("B", "S", OUTSIDE)
            or prev != OUTSIDE and prev_type != cur_type)


def _starts(prev, prev_type, cur, cur_type):
    """conlleval's startOfChunk, with S (seqeval): does a chunk start at ``cur``?"""
    return (cur in ("B", "S")
            or cur in ("I", "E") and prev in (OUTSIDE, "E", "S")
            or cur != OUTSIDE and prev_type != cur_type)


def chunks(tags, scheme):
    """The chunks of one tag sequence as a list of ``(type, start, end_exclusive)``.

    Raises ValueError for a tag outside the scheme, and for ``plain`` (no chunks)."""
    return read_chunks(tags, scheme)[0]


def read_chunks(tags, scheme):
    """``(chunks, repaired)``: the chunks of ``chunks`` and how many of them the repair rule
    read from an ill-formed sequence (a model's output need not be well formed).

    The rule is conlleval's (seqeval's default mode for E/S): an I/M/E that does not continue
    a chunk of its type starts a new chunk, and a chunk ends where the next tag cannot
    continue it.  A chunk counts as repaired when it does not start with B or S, or, in a
    closed scheme (BIOES, BMES), when it does not end with E (or is not one S): e.g. BMES
    ``B B B E E E E`` reads as the words ``B | B | B E | E | E | E`` with 5 of them repaired.
    """
    if not SCHEME[scheme].has_chunks:
        raise ValueError("plain tags have no chunks; score them by token accuracy")
    closed = SCHEME[scheme].closed
    out, start, repaired = [], None, 0
    prev, prev_type = OUTSIDE, ""
    for i, tag in enumerate([*tags, OUTSIDE]):
        cur, cur_type = _chunk_tag(tag, scheme)
        if cur == prev == OUTSIDE:
            continue  # nothing ends or starts between two O (most tokens of NER data)
        if start is not None and _ends(prev, prev_type, cur, cur_type):
            out.append((prev_type, start, i))
            first = _chunk_tag(tags[start], scheme)[0]
            # S is one token by the rule; B must be closed by E in BIOES/BMES
            repaired += not (first == "S" or first == "B" and (not closed or prev == "E"))
            start = None
        if _starts(prev, prev_type, cur, cur_type):
            start = i
        prev, prev_type = cur, cur_type
    return out, repaired


@functools.lru_cache(maxsize=4096)
def _chunk_tag(tag, scheme):
    """(prefix, type) of a tag of a chunk scheme, with BMES's M read as I (cached: evaluation
    calls this for every token)."""
    if not fits(tag, scheme):
        raise ValueError(f"not a {scheme.upper()} tag: {tag!r}; expected {expected_tags(scheme)}")
    prefix, etype = split_tag(tag)
    return ("I" if prefix == "M" else prefix), etype  # BMES is BIOES with M for I
