"""Texts longer than max_len: truncate (counted), window (with stride), or error (numpy only).

Applied once, when a dataset is built (and by the deploy predictor on request
texts).  Never silent: truncation is counted per split (examples, tokens lost)
and logged.  Windows keep their document's ``doc_id`` and the ``offset`` of
their first token so predictions can be put back together:
* classification: ``aggregate_classification`` — mean of the windows' logits;
* tagging: ``aggregate_tokens`` — each token's output from the window where it
  is most central (farthest from a window edge).

Spans are over the CONTENT tokens (special tokens excluded): a document of n
tokens with ``max_content`` = max_len - number of special tokens.
"""
import numpy as np

from ..utils.log import get_logger
from .errors import DataError

log = get_logger("data.longtext")

POLICIES = ("truncate", "window", "error")


def window_spans(n_tokens, window, overlap):
    """[(start, end)] windows of ``window`` tokens overlapping by at least ``overlap``.

    The windows cover every token; the last one is aligned to the document's end
    (so it may overlap its neighbour by more than ``overlap``).
    """
    if window < 1:
        raise ValueError(f"window must be >= 1 token, got {window}")
    if not 0 <= overlap < window:
        raise ValueError(f"Data.stride (window overlap) must be in [0, {window}) for windows of "
                         f"{window} content tokens, got {overlap}; lower Data.stride or raise "
                         f"Data.max_len")
    if n_tokens <= window:
        return [(0, n_tokens)]
    step = window - overlap
    spans = [(s, s + window) for s in range(0, n_tokens - window, step)]
    spans.append((n_tokens - window, n_tokens))
    return spans


# Clause punctuation: where the g2p corpus cuts paragraphs (full-width, data/g2p.py) and where a
# long seq2seq source is cut at serving time (ASCII forms too: users type both).
FULLWIDTH_CLAUSE_END = frozenset("。！？，；：、")
CLAUSE_END = FULLWIDTH_CLAUSE_END | frozenset("!?,;:")


def clause_spans(tokens, max_content):
    """Consecutive spans covering every token, each at most ``max_content`` long.

    Each span ends after the last clause punctuation token within reach, so clauses are packed
    whole as the g2p corpus packs them; a clause longer than ``max_content`` is cut at it.
    """
    if max_content < 1:
        raise ValueError(f"clause_spans: max_content must be >= 1, got {max_content}")
    spans, start, n = [], 0, len(tokens)
    while start < n:
        end = min(start + max_content, n)
        if end < n:
            end = max((i + 1 for i in range(start, end) if tokens[i] in CLAUSE_END), default=end)
        spans.append((start, end))
        start = end
    return spans


def plan_spans(n_tokens, max_content, policy, stride, where):
    """Spans of content tokens to keep for one document under ``policy``.

    ``where`` names the document in error messages (e.g. "train.txt line 12").
    """
    if policy not in POLICIES:
        raise ValueError(f"Data.long_text must be one of {POLICIES}, got {policy!r}")
    if max_content < 1:
        raise ValueError(f"Data.max_len leaves {max_content} tokens for content after special "
                         f"tokens; raise Data.max_len")
    if n_tokens <= max_content:
        return [(0, n_tokens)]
    if policy == "error":
        raise DataError(f"{where}: {n_tokens} tokens > {max_content} allowed by Data.max_len "
                        f"(special tokens excluded). Set Data.long_text: truncate or window, or "
                        f"raise Data.max_len")
    if policy == "truncate":
        return [(0, max_content)]
    return window_spans(n_tokens, max_content, stride)


def text_windows(ids, max_len, policy, stride, where, specials=None):
    """One text's token ids -> (rows, spans): the spans of its content ``plan_spans`` keeps under
    ``policy`` (``max_len`` minus the two special tokens when ``specials`` = (cls_id, sep_id)),
    each as a row with ``[CLS] .. [SEP]`` around it when ``specials`` is given.  The one rule the
    stores (``Task.encode_example``) and the predictor (request texts) share, so that a served
    text is cut and wrapped as the training items were.  ``ids``: a list (rows are lists) or a
    numpy array (rows are arrays of its dtype)."""
    spans = plan_spans(len(ids), max_len - (2 if specials else 0), policy, stride, where)
    rows = [ids[s:e] for s, e in spans]
    if specials is not None:
        cls_id, sep_id = specials
        rows = ([np.concatenate(([cls_id], r, [sep_id])).astype(ids.dtype) for r in rows]
                if isinstance(ids, np.ndarray) else [[cls_id] + r + [sep_id] for r in rows])
    return rows, spans


def batch_spans(lengths, max_content, policy, stride):
    """``plan_spans`` of many documents at once (``lengths``: tokens of each) -> (document
    index, start, end) of every span as int64 arrays, the documents' spans in order.  For a
    batch ``plan_spans`` accepts (under ``error`` no document is longer than ``max_content``):
    a caller checks that first, as it raises the messages."""
    lengths = np.asarray(lengths, np.int64)
    docs = np.arange(len(lengths), dtype=np.int64)
    if policy != "window" or not (lengths > max_content).any():
        # one span per document, cut to max_content
        return docs, np.zeros(len(lengths), np.int64), np.minimum(lengths, max_content)
    spans = [window_spans(n, max_content, stride) for n in lengths.tolist()]
    counts = np.fromiter(map(len, spans), np.int64, len(spans))
    flat = np.asarray([se for doc in spans for se in doc], np.int64).reshape(-1, 2)
    return np.repeat(docs, counts), flat[:, 0], flat[:, 1]


def span_rows(ids, offsets, docs, starts, ends, specials=None):
    """The rows ``text_windows`` makes, for many spans at once: row k holds
    ``ids[offsets[docs[k]] + starts[k]:offsets[docs[k]] + ends[k]]`` (``ids``: documents' ids
    one after the other, ``offsets``: where each document starts), with ``[CLS] .. [SEP]``
    around it when ``specials`` = (cls_id, sep_id) -> (the rows one after the other, in
    ``ids``' dtype, and each row's length (int64))."""
    edge = 1 if specials else 0
    row_lengths = ends - starts + 2 * edge
    row_ends = np.cumsum(row_lengths)
    row_starts = row_ends - row_lengths
    # out[p] = ids[p + shift of p's row]: one gather (a special token's position reads a
    # valid index, then is overwritten)
    source = np.arange(int(row_ends[-1]) if len(row_ends) else 0, dtype=np.int64)
    source += np.repeat(offsets[docs] + starts - row_starts - edge, row_lengths)
    if specials:
        source[row_starts] = source[row_ends - 1] = 0
    out = ids[source]
    if specials:
        out[row_starts], out[row_ends - 1] = specials
    return out, row_lengths


class LongTextStats:
    """Per-split counts of what the policy did; ``as_dict()`` goes into dataset stats."""

    def __init__(self, split, policy):
        self.split, self.policy = split, policy
        self.documents = self.long_documents = self.truncated = 0
        self.tokens_lost = self.windows = 0

    def add(self, n_tokens, spans):
        # not add_batch of one document: this runs once per document (Task._encode_each), where
        # plain ints cost less than add_batch's numpy calls
        self.documents += 1
        self.windows += len(spans)
        kept = max(end for _, end in spans) - min(start for start, _ in spans)
        if kept < n_tokens or len(spans) > 1:
            self.long_documents += 1
        if self.policy == "truncate" and kept < n_tokens:
            self.truncated += 1
            self.tokens_lost += n_tokens - kept

    def add_batch(self, n_tokens, kept, windows):
        """``add`` for many documents: per document its tokens, the tokens from its first
        kept one to its last (``max(end) - min(start)`` of its spans) and its span count."""
        n_tokens, kept, windows = (np.asarray(a, np.int64) for a in (n_tokens, kept, windows))
        self.documents += len(n_tokens)
        self.windows += int(windows.sum())
        cut = kept < n_tokens
        self.long_documents += int(np.count_nonzero(cut | (windows > 1)))
        if self.policy == "truncate":
            self.truncated += int(np.count_nonzero(cut))
            self.tokens_lost += int((n_tokens - kept)[cut].sum())

    def as_dict(self):
        return {"policy": self.policy, "documents": self.documents,
                "long_documents": self.long_documents, "truncated": self.truncated,
                "tokens_lost": self.tokens_lost, "windows": self.windows}

    def log(self):
        if self.truncated:
            log.warning("%s: truncated %d of %d examples to Data.max_len (%d tokens lost); "
                        "set Data.long_text: window to keep them", self.split, self.truncated,
                        self.documents, self.tokens_lost)
        elif self.long_documents:
            log.info("%s: %d long documents split into windows (%d items from %d documents)",
                     self.split, self.long_documents, self.windows, self.documents)


def aggregate_classification(doc_ids, logits):
    """One row per document: the mean of its windows' logits.

    Returns ``(unique_doc_ids, mean_logits)`` sorted by doc id.
    """
    doc_ids = np.asarray(doc_ids, dtype=np.int64)
    logits = np.asarray(logits, dtype=np.float64)
    if logits.shape[0] != doc_ids.shape[0]:
        raise ValueError(f"aggregate_classification: {doc_ids.shape[0]} doc ids but "
                         f"{logits.shape[0]} logit rows")
    uniq, inverse = np.unique(doc_ids, return_inverse=True)
    sums = np.zeros((uniq.size,) + logits.shape[1:], dtype=np.float64)
    np.add.at(sums, inverse, logits)
    counts = np.bincount(inverse, minlength=uniq.size).reshape((-1,) + (1,) * (logits.ndim - 1))
    return uniq, (sums / counts).astype(np.float32)


def aggregate_tokens(doc_ids, offsets, window_outputs):
    """Per-document token outputs from overlapping windows.

    ``window_outputs[w]`` holds one row per CONTENT token of window w (strip
    special tokens and padding first; rows may be tag ids or emission vectors),
    starting at document position ``offsets[w]``.  Each position takes its row
    from the window where it is most central (largest distance to the nearer
    window edge; ties -> the earlier window).  Returns ``(unique_doc_ids,
    [array per document])``; a position no window covers is an error.
    """
    if not len(doc_ids) == len(offsets) == len(window_outputs):
        raise ValueError("aggregate_tokens: doc_ids, offsets and window_outputs differ in length")
    by_doc = {}
    for w, (doc, off, rows) in enumerate(zip(doc_ids, offsets, window_outputs)):
        by_doc.setdefault(int(doc), []).append((int(off), np.asarray(rows)))
    uniq = sorted(by_doc)
    out = []
    for doc in uniq:
        windows = by_doc[doc]
        n = max(off + len(rows) for off, rows in windows)
        first = windows[0][1]
        result = np.zeros((n,) + first.shape[1:], dtype=first.dtype)
        best = np.full(n, -1, dtype=np.int64)
        for off, rows in windows:
            pos = np.arange(len(rows))
            centrality = np.minimum(pos, len(rows) - 1 - pos)
            better = centrality > best[off:off + len(rows)]
            result[off:off + len(rows)][better] = rows[better]
            best[off:off + len(rows)][better] = centrality[better]
        if (best < 0).any():
            gap = int(np.flatnonzero(best < 0)[0])
            raise ValueError(f"aggregate_tokens: document {doc} position {gap} is covered by no "
                             f"window; pass every window of the document")
        out.append(result)
    return uniq, out
