"""Model registry: ``build_model(model_cfg, vocab_size, num_labels, pad_id, task)``.

Every model: ``forward(self, input_ids, seq_len, labels=None)`` with masks
built inside from ``seq_len`` (see docs/DESIGN.md "Models").  Model modules are
imported when chosen, so building a GRU tagger does not import PaddleNLP.
"""
import copy
import importlib

from ..config import Config, ConfigError
from ..config_schema import MODEL_KEYS, SCHEMA

# Model.name -> (module, task it serves)
MODEL_TASKS = {
    "transformer_cls": "classification",
    "rnn_cls": "classification",
    "ernie_cls": "classification",
    "bigru_crf": "tagging",
    "ernie_tagger": "tagging",
    "seq2seq": "seq2seq",
    "paddlenlp_seq_cls": "classification",
    "paddlenlp_token_cls": "tagging",
}


# Tasks that train the encoder of another task's model: task -> (models with that encoder,
# the task they are built for, module and class of the layer wrapped around them).
ENCODER_TASKS = {"masked_lm": (("transformer_cls",), "classification", "masked_lm", "MaskedLM")}


def _check_task(name, task):
    """The task ``name`` is built for when it serves ``task`` (ConfigError otherwise)."""
    if task in ENCODER_TASKS:
        names, built_for = ENCODER_TASKS[task][:2]
        if name not in names:
            raise ConfigError(f"Model.name={name}: the {task} task trains the encoder of "
                              f"{', '.join(names)} (its encode()); set Model.name: {names[0]}")
        return built_for
    if MODEL_TASKS[name] != task:
        raise ConfigError(f"Model.name={name} is a {MODEL_TASKS[name]} model but the data task is "
                          f"{task!r}; pick a {task} model ("
                          f"{', '.join(n for n, t in MODEL_TASKS.items() if t == task)})")
    return task


def _resolve(model_cfg):
    """The keys the chosen model reads (``MODEL_KEYS``): schema defaults + the given values,
    as a plain dict, so a builder cannot read a key its model does not declare.

    A Config was checked at load time (a key the model does not use is an error there);
    a plain dict may also carry other models' keys (tests share one size dict), which
    are left out here.  Unknown keys are an error either way.
    """
    given = model_cfg.to_dict() if isinstance(model_cfg, Config) else dict(model_cfg or {})
    unknown = sorted(set(given) - set(SCHEMA["Model"]))
    if unknown:
        raise ConfigError(f"Model: unknown key(s) {unknown}; valid keys: {sorted(SCHEMA['Model'])}")
    name = given.get("name", SCHEMA["Model"]["name"].default)
    if name not in MODEL_KEYS:
        raise ConfigError(f"Model.name={name!r} is not one of {sorted(MODEL_KEYS)}")
    keys = ("name",) + MODEL_KEYS[name]
    resolved = {k: copy.deepcopy(SCHEMA["Model"][k].default) for k in keys}
    resolved.update((k, v) for k, v in given.items() if k in keys)
    return resolved


def build_model(model_cfg, vocab_size, num_labels, pad_id, task, init_weights=True):
    """Build the ``Model.name`` model for ``task`` with the given vocabulary and label count.

    ``Model.init_from`` (warm start) is loaded when ``init_weights``; code that
    loads a full checkpoint right after passes False, so the pretraining file
    need not exist on an export or serving host.
    """
    cfg = _resolve(model_cfg)
    name = cfg["name"]
    if name not in MODEL_TASKS:
        raise ConfigError(f"Model.name={name!r} is not one of {sorted(MODEL_TASKS)}")
    if task in ENCODER_TASKS:  # e.g. masked-LM: the classifier inside an MLM head
        module, layer = ENCODER_TASKS[task][2:]
        inner = build_model(model_cfg, vocab_size, num_labels, pad_id, _check_task(name, task),
                            init_weights)
        return getattr(importlib.import_module(f"ppvarlen.models.{module}"), layer)(inner)
    _check_task(name, task)
    builder = _BUILDERS[name]
    if vocab_size < 1 or num_labels < getattr(builder, "min_labels", 1):
        raise ValueError(f"build_model: vocab_size={vocab_size} and num_labels={num_labels} must be >= 1")
    model = builder(cfg, vocab_size, num_labels, pad_id, init_weights)
    if cfg.get("init_from") and init_weights:
        _warm_start(model, cfg["init_from"])
    return model


def _warm_start(model, path):
    from ..utils.log import get_logger
    from .weights import load_matching_weights

    report = load_matching_weights(model, path, key="Model.init_from")
    log = get_logger("ppvarlen.models")
    log.info("Model.init_from=%s: loaded %d tensors; kept the fresh init of %d: %s; ignored %d in the "
             "file: %s", path, len(report["loaded"]), len(report["missing"]), report["missing"],
             len(report["unexpected"]), report["unexpected"])


def _transformer_cls(cfg, vocab_size, num_labels, pad_id, init_weights=True):
    from .transformer_cls import TransformerClassifier

    return TransformerClassifier(
        vocab_size, num_labels, hidden_size=cfg["hidden_size"], num_layers=cfg["num_layers"],
        num_heads=cfg["num_heads"], ffn_size=cfg["ffn_size"], dropout=cfg["dropout"],
        max_position=cfg["max_position"], pooling=cfg["pooling"] or "cls",
        ngram_buckets=cfg["ngram_buckets"], ngram_orders=cfg["ngram_orders"],
        ngram_dropout=cfg["ngram_dropout"], wide_buckets=cfg["wide_buckets"],
        wide_orders=cfg["wide_orders"], wide_dropout=cfg["wide_dropout"], wide_scale=cfg["wide_scale"],
        token_dropout=cfg["token_dropout"], rdrop_alpha=cfg["rdrop_alpha"])


def _rnn_cls(cfg, vocab_size, num_labels, pad_id, init_weights=True):
    from .rnn_cls import RNNClassifier

    return RNNClassifier(
        vocab_size, num_labels, emb_size=cfg["emb_size"], hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_layers"], cell=cfg["cell"], dropout=cfg["dropout"],
        pooling=cfg["pooling"] or "last", ngram_buckets=cfg["ngram_buckets"],
        ngram_orders=cfg["ngram_orders"], ngram_dropout=cfg["ngram_dropout"])


def _bigru_crf(cfg, vocab_size, num_labels, pad_id, init_weights=True):
    from .bigru_crf import BiGRUCRF

    return BiGRUCRF(vocab_size, num_labels, emb_size=cfg["emb_size"], hidden_size=cfg["hidden_size"],
                    num_layers=cfg["num_layers"], dropout=cfg["dropout"])


def _ernie(cfg, vocab_size, num_labels, pad_id, init_weights=True):
    from .ernie import ErnieClassifier, ErnieTagger, build_ernie_backbone

    backbone = build_ernie_backbone(cfg["pretrained_dir"], cfg["ernie_config"], vocab_size, pad_id,
                                    cfg["max_position"])
    model_class = ErnieClassifier if cfg["name"] == "ernie_cls" else ErnieTagger
    return model_class(backbone, num_labels, dropout=cfg["dropout"])


def _paddlenlp(cfg, vocab_size, num_labels, pad_id, init_weights=True):
    from . import paddlenlp_auto

    model_class = {"paddlenlp_seq_cls": paddlenlp_auto.PaddleNLPSequenceClassifier,
                   "paddlenlp_token_cls": paddlenlp_auto.PaddleNLPTokenClassifier}[cfg["name"]]
    # without init_weights a ppvarlen checkpoint supplies every weight: config.json suffices
    return paddlenlp_auto.build_paddlenlp_model(model_class, cfg["pretrained_dir"],
                                                cfg["max_position"], vocab_size, num_labels,
                                                init_weights)


def _seq2seq(cfg, vocab_size, num_labels, pad_id, init_weights):
    # num_labels = the output vocabulary (ids < num_labels can be generated); 0 = all ids
    from .seq2seq import build_seq2seq

    return build_seq2seq(Config(cfg), vocab_size, pad_id=pad_id, output_size=num_labels or None)


_seq2seq.min_labels = 0

_BUILDERS = {
    "transformer_cls": _transformer_cls,
    "rnn_cls": _rnn_cls,
    "bigru_crf": _bigru_crf,
    "ernie_cls": _ernie,
    "ernie_tagger": _ernie,
    "paddlenlp_seq_cls": _paddlenlp,
    "paddlenlp_token_cls": _paddlenlp,
    "seq2seq": _seq2seq,
}
