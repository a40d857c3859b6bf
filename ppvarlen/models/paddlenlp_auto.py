"""Any local PaddleNLP ``save_pretrained`` directory as a ppvarlen model (head kept).

``Model.name: paddlenlp_seq_cls`` loads ``AutoModelForSequenceClassification``,
``paddlenlp_token_cls`` ``AutoModelForTokenClassification``, ``paddlenlp_qa``
``AutoModelForQuestionAnswering`` (start/end logits), from ``Model.pretrained_dir``
(ERNIE, BERT and the other architectures PaddleNLP's Auto classes map; the fine-tuned
classifier is kept, ``num_labels`` comes from the directory's config.json);
``paddlenlp_embed`` loads ``AutoModel``, the bare encoder (whatever head the directory has),
and pools its sequence output over real tokens into embeddings [B, D] (``PaddleNLPEmbedder``;
the pooling from the directory's sentence-transformers files or Model.pooling,
models/sentence_transformers_dir.py).

Offline and pickle-free: only an existing directory is read, and only when it holds
``model.safetensors``.  PaddleNLP 2.8.1's ``_resolve_model_file_path`` prefers the
safetensors files of a local directory but falls back to ``model_state.pdparams``
(``paddle.load``: pickle) even with ``use_safetensors=True``, so a directory without
safetensors weights is refused here, before PaddleNLP looks at it
(tests/models/test_paddlenlp_models.py loads with pickle disabled).

ppvarlen's model contract, ``forward(input_ids, seq_len, labels=None)``: the wrapper builds
everything PaddleNLP would build from ``input_ids`` alone, but from ``seq_len`` and with
dynamic shapes (one to_static trace for every batch shape):

* attention mask: the [B, 1, 1, L] additive mask (``masks.key_padding_mask``), which
  PaddleNLP models add to the attention scores as is (their own default is
  ``input_ids == pad_token_id``: wrong when pad positions hold other ids);
* ``position_ids`` 0..L-1 and ``token_type_ids`` zeros (a single-text input), explicit;
* the word embedding of a pad position is zeroed by a forward post-hook on the model's
  input embedding (``_zero_pad_embeddings``), so pad ids never reach the output and get no
  gradient (BertModel takes no ``inputs_embeds``, so the hook is the one way for every
  architecture).  Pad positions are rewritten to ``pad_token_id`` first, which is what the
  hook recognises; text never encodes to the pad id (data.vocab).

``save_paddlenlp_dir(directory, encoder, label_names)`` writes the trained model back as a
PaddleNLP directory (safetensors weights, config.json with the label names, tokenizer
files) that ``AutoModelFor*.from_pretrained`` reloads with identical logits.
"""
import os

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from ..config import ConfigError
from ..model_registry import MODELS
from ..utils.io import atomic_dir
from .masks import (key_padding_mask, masked_cross_entropy, pool, position_cross_entropy,
                    sequence_mask)
from .sentence_transformers_dir import resolve_pooling, write_pooling_modules
from .transformer_cls import check_max_position

SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
PICKLE_WEIGHTS = ("model_state.pdparams", "model_state.pdparams.index.json")
CONVERT_HINT = (
    "ppvarlen never unpickles received weights (a crafted .pdparams runs code when loaded). If you "
    "trust the file, convert it once on a machine where that is acceptable: "
    "python -c \"from paddlenlp.transformers import AutoModelForSequenceClassification as A; "
    "A.from_pretrained('DIR').save_pretrained('DIR', safe_serialization=True)\" "
    "(AutoModelForTokenClassification for a token classifier); that writes DIR/model.safetensors")


def check_pretrained_dir(directory, key="Model.pretrained_dir"):
    """ConfigError unless ``directory`` is a local PaddleNLP directory with safetensors weights."""
    if not directory or not os.path.isdir(directory):
        raise ConfigError(f"{key}={directory}: not a local directory; give the directory "
                          f"save_pretrained wrote (config.json, {SAFE_WEIGHTS}, vocab.txt, "
                          f"tokenizer_config.json). Nothing is downloaded: hub names are not read")
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise ConfigError(f"{key}={directory}: no config.json; the directory must be written by "
                          f"PaddleNLP's save_pretrained")
    if not any(os.path.isfile(os.path.join(directory, f)) for f in (SAFE_WEIGHTS, SAFE_INDEX)):
        found = [f for f in PICKLE_WEIGHTS if os.path.isfile(os.path.join(directory, f))]
        if found:
            raise ConfigError(f"{key}={directory}: only pickle weights ({', '.join(found)}), no "
                              f"{SAFE_WEIGHTS}. {CONVERT_HINT}".replace("DIR", directory))
        raise ConfigError(f"{key}={directory}: no {SAFE_WEIGHTS} found")
    return directory


def read_config(directory, key="Model.pretrained_dir"):
    """The directory's PaddleNLP config (AutoConfig over config.json; local file only)."""
    from paddlenlp.transformers import AutoConfig

    check_pretrained_dir(directory, key)
    try:
        return AutoConfig.from_pretrained(directory)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{key}={directory}/config.json: PaddleNLP cannot read it ({e})") from None


def label_names_of(config):
    """Label names in id order from config.json's id2label (``LABEL_i`` when it has none)."""
    id2label = {int(k): v for k, v in (getattr(config, "id2label", None) or {}).items()}
    return [str(id2label.get(i, f"LABEL_{i}")) for i in range(int(config.num_labels))]


def load_auto_model(directory, auto_class, weights=True):
    """``AutoModelFor*`` from a checked local directory; ``weights=False`` builds the
    architecture from config.json only (a ppvarlen checkpoint then supplies every weight)."""
    import paddlenlp.transformers as pt

    auto = getattr(pt, auto_class)
    if not weights:
        return auto.from_config(read_config(directory))
    check_pretrained_dir(directory)
    return auto.from_pretrained(directory, use_safetensors=True, convert_from_torch=False,
                                from_hf_hub=False, from_aistudio=False)


def _zero_pad_embeddings(pad_token_id):
    """Forward post-hook of the word embedding: rows whose id is ``pad_token_id`` -> 0."""
    def hook(layer, inputs, output):
        keep = (inputs[0] != pad_token_id).astype(output.dtype).unsqueeze(-1)
        return output * keep
    return hook


class PaddleNLPModel(nn.Layer):
    """A PaddleNLP ``*ForSequenceClassification`` / ``*ForTokenClassification`` under
    ppvarlen's contract; ``self.net`` is the PaddleNLP model itself (its state_dict names
    prefixed ``net.`` in ppvarlen checkpoints)."""

    auto_class = ""
    architecture_suffix = ""
    has_head = True  # the directory's head is kept: its num_labels must match the data

    @classmethod
    def options_of(cls, directory, config, options, keys=None, log_choice=True):
        """The constructor's keyword arguments beyond (net, max_position) from the family's
        Model keys ``options`` (``keys``: how errors name each key): none."""
        return {}

    def __init__(self, net, max_position):
        super().__init__()
        self.net = net
        config = net.config
        self.pad_token_id = int(config.pad_token_id if config.pad_token_id is not None else 0)
        self.max_position = int(max_position)
        embedding = net.get_input_embeddings()
        embedding.register_forward_post_hook(_zero_pad_embeddings(self.pad_token_id))

    def logits(self, input_ids, seq_len, token_type_ids=None):
        """The net's first output (its logits) as float32."""
        out = self.outputs(input_ids, seq_len, token_type_ids)
        return out[0].astype("float32")

    def outputs(self, input_ids, seq_len, token_type_ids=None):
        """The net's outputs (a tuple) for right-padded ids of lengths ``seq_len``."""
        check_max_position(input_ids, self.max_position, key="Model.max_position")
        max_len = paddle.shape(input_ids)[1]
        real = sequence_mask(seq_len, max_len, dtype="int64")
        ids = input_ids * real + self.pad_token_id * (1 - real)
        # expand(shape), not expand_as: paddle2onnx 2.1.0 exports expand_as as an invalid Expand
        position_ids = paddle.arange(max_len, dtype="int64").unsqueeze(0).expand(paddle.shape(ids))
        # segment ids of a text pair (0 on pads), else all 0 (a single text)
        segments = paddle.zeros_like(ids) if token_type_ids is None else token_type_ids * real
        out = self.net(input_ids=ids, token_type_ids=segments,
                       position_ids=position_ids,
                       attention_mask=key_padding_mask(seq_len, max_len, dtype="float32"),
                       return_dict=False)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def save_paddlenlp_dir(self, directory, encoder, label_names):
        """Write a PaddleNLP directory (safetensors, label names in config.json, tokenizer
        files) atomically; ``AutoModelFor*.from_pretrained(directory)`` reloads it."""
        config = self.net.config
        config.id2label = {i: str(n) for i, n in enumerate(label_names)}
        config.label2id = {str(n): i for i, n in enumerate(label_names)}
        with atomic_dir(directory) as tmp:
            self.net.save_pretrained(tmp, safe_serialization=True)
            encoder.save_pretrained_tokenizer(tmp)
        return directory


class PaddleNLPSequenceClassifier(PaddleNLPModel):
    """logits [B, C] float32 from the directory's own classification head."""

    auto_class = "AutoModelForSequenceClassification"
    architecture_suffix = "ForSequenceClassification"  # of config.json's architectures

    def forward(self, input_ids, seq_len, token_type_ids=None, labels=None):
        logits = self.logits(input_ids, seq_len, token_type_ids)
        if labels is None:
            return logits
        return masked_cross_entropy(logits, labels), logits


class PaddleNLPTokenClassifier(PaddleNLPModel):
    """emissions [B, L, T] float32 from the directory's token head; tags = argmax (0 on pads)."""

    auto_class = "AutoModelForTokenClassification"
    architecture_suffix = "ForTokenClassification"

    def __init__(self, net, max_position):
        super().__init__(net, max_position)
        # The backbone's [CLS] pooler is off the token head's path: it never gets a gradient,
        # so the optimizer never makes its moments, and a resumed run (which creates moments
        # for every trainable parameter) would not find them.  Frozen, it is simply not trained
        # (as before) and still saved.
        pooler = getattr(getattr(net, net.base_model_prefix, None), "pooler", None)
        for param in pooler.parameters() if isinstance(pooler, nn.Layer) else ():
            param.stop_gradient = True

    def forward(self, input_ids, seq_len, labels=None):
        emissions = self.logits(input_ids, seq_len)
        if labels is None:
            mask = sequence_mask(seq_len, paddle.shape(input_ids)[1], dtype="int64")
            return emissions, paddle.argmax(emissions, axis=-1) * mask
        return masked_cross_entropy(emissions, labels), emissions


class PaddleNLPQuestionAnswering(PaddleNLPTokenClassifier):
    """start_logits, end_logits [B, L] float32 from the directory's span head
    (``*ForQuestionAnswering``); with ``labels`` [B, 2] (start, end positions) the mean
    cross-entropy of both over the row's real tokens first."""

    auto_class = "AutoModelForQuestionAnswering"
    architecture_suffix = "ForQuestionAnswering"

    def forward(self, input_ids, seq_len, token_type_ids=None, labels=None):
        start, end = (o.astype("float32") for o in
                      self.outputs(input_ids, seq_len, token_type_ids)[:2])
        if labels is None:
            return start, end
        return position_cross_entropy((start, end), labels, seq_len), (start, end)


class PaddleNLPEmbedder(PaddleNLPModel):
    """embeddings [B, D] float32: the bare encoder (``AutoModel``, any head of the directory
    dropped) pooled over real tokens (``masks.pool``: cls = the first position's state, not
    the [CLS] pooler's tanh; mean; last = position seq_len - 1), then optionally L2-normalised
    (after pooling, as sentence-transformers' Normalize module does).  The pooling comes from
    the directory (sentence_transformers_dir) or Model.pooling, never both disagreeing."""

    auto_class = "AutoModel"
    architecture_suffix = None  # AutoModel reads the encoder of any head: chosen by --task only
    has_head = False

    @classmethod
    def options_of(cls, directory, config, options, keys=None, log_choice=True):
        """pooling / normalize: Model.pooling / Model.normalize merged with what the directory
        says (``resolve_pooling``: a contradiction is a ConfigError)."""
        keys = keys or {}
        pooling, normalize = resolve_pooling(
            directory, options.get("pooling"), options.get("normalize"),
            hidden_size=int(config.hidden_size),
            pooling_key=keys.get("pooling", "Model.pooling"),
            normalize_key=keys.get("normalize", "Model.normalize"), log_choice=log_choice)
        return {"pooling": pooling, "normalize": normalize,
                "temperature": options.get("temperature", 0.05)}

    def __init__(self, net, max_position, pooling, normalize, temperature=0.05):
        super().__init__(net, max_position)
        self.pooling, self.normalize = pooling, bool(normalize)
        if not temperature > 0:
            raise ConfigError(f"Model.temperature={temperature}: InfoNCE divides the "
                              f"similarities by it; use a positive value (e.g. 0.05)")
        self.temperature = float(temperature)  # the embedding task's InfoNCE (training only)
        self.embedding_dim = int(net.config.hidden_size)
        # the [CLS] pooler (dense + tanh) is off the embedding's path: frozen, as the token
        # classifier's (a resumed run finds optimizer moments for every trainable parameter)
        pooler = getattr(net, "pooler", None)
        for param in pooler.parameters() if isinstance(pooler, nn.Layer) else ():
            param.stop_gradient = True

    def forward(self, input_ids, seq_len, token_type_ids=None):
        states = self.outputs(input_ids, seq_len, token_type_ids)[0].astype("float32")
        pooled = pool(states, seq_len, self.pooling)
        return F.normalize(pooled, p=2, axis=-1) if self.normalize else pooled

    def save_paddlenlp_dir(self, directory, encoder, label_names=None):
        """The encoder as a PaddleNLP directory plus the sentence-transformers module files
        saying its pooling / normalisation, so the directory alone exports the same vectors."""
        with atomic_dir(directory) as tmp:
            self.net.save_pretrained(tmp, safe_serialization=True)
            encoder.save_pretrained_tokenizer(tmp)
            write_pooling_modules(tmp, self.pooling, self.normalize, self.embedding_dim)
        return directory


def build_paddlenlp_model(model_class, pretrained_dir, max_position, vocab_size, num_labels,
                          init_weights=True, options=None):
    """The wrapped PaddleNLP model, its config checked against the data (ConfigError);
    ``options`` the Model keys of the family beyond the directory (embedder: pooling, normalize)."""
    config = read_config(pretrained_dir)
    where = os.path.join(pretrained_dir, "config.json")
    if int(config.vocab_size) != int(vocab_size):
        raise ConfigError(f"{where}: vocab_size={config.vocab_size} but the data vocabulary has "
                          f"{vocab_size} tokens; tokenize with the directory's own tokenizer: "
                          f"Data.tokenizer: pretrained, Data.vocab_file: {pretrained_dir}")
    if model_class.has_head and int(config.num_labels) != int(num_labels):
        raise ConfigError(f"{where}: the model's head has num_labels={config.num_labels} "
                          f"({label_names_of(config)}) but the data has {num_labels} labels; "
                          f"use data with the head's labels, or re-save the model with "
                          f"num_labels={num_labels} (a new head) before training")
    table = int(config.max_position_embeddings)
    if max_position > table:
        raise ConfigError(f"Model.max_position={max_position} exceeds the directory's "
                          f"max_position_embeddings={table} ({where}); set Model.max_position: "
                          f"{table} (and Data.max_len <= {table})")
    extra = model_class.options_of(pretrained_dir, config, options or {})
    net = load_auto_model(pretrained_dir, model_class.auto_class, weights=init_weights)
    return model_class(net, max_position, **extra)


# Model.name -> wrapper class; ``architectures`` in config.json ends with the class's suffix
FAMILY = {"paddlenlp_seq_cls": PaddleNLPSequenceClassifier,
          "paddlenlp_token_cls": PaddleNLPTokenClassifier,
          "paddlenlp_qa": PaddleNLPQuestionAnswering,
          "paddlenlp_embed": PaddleNLPEmbedder}


def model_name_for(config, task, directory):
    """(Model.name, task name) of a directory: from config.json's ``architectures``, else from
    ``task``; ConfigError when neither decides or they disagree.  A family without an
    architecture suffix (the embedder: AutoModel reads the encoder under any head) is chosen
    by ``task`` alone."""
    if task is not None:
        for name, model_class in FAMILY.items():
            if model_class.architecture_suffix is None and MODELS[name].serves(task):
                return name, task
    archs = list(getattr(config, "architectures", None) or [])
    by_arch = [n for n, c in FAMILY.items() if c.architecture_suffix is not None
               and any(a.endswith(c.architecture_suffix) for a in archs)]
    by_task = [n for n in FAMILY if task is None or MODELS[n].serves(task)]
    names = [n for n in by_arch if n in by_task] if by_arch else by_task
    if len(names) != 1:
        served = {t for n in FAMILY for t in MODELS[n].tasks}
        raise ConfigError(
            f"--pretrained-dir {directory}: config.json architectures {archs or 'missing'} "
            + (f"is not a {task} model" if by_arch else "do not say the task")
            + f"; pass --task ({' or '.join(sorted(served))}) matching the model's head")
    return names[0], MODELS[names[0]].tasks[0]


def build(cfg, vocab_size, num_labels, pad_id, init_weights=True):
    """The registered builder of the paddlenlp_* families; without ``init_weights`` a ppvarlen
    checkpoint supplies every weight: config.json suffices."""
    options = {k: cfg[k] for k in ("pooling", "normalize", "temperature") if k in cfg}
    return build_paddlenlp_model(FAMILY[cfg["name"]], cfg["pretrained_dir"], cfg["max_position"],
                                 vocab_size, num_labels, init_weights, options)
