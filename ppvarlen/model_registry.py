"""The model families, one ``register_model`` call each: the tasks a family serves, its builder
and the Model config keys it reads (type, default, meaning).

``config_schema`` reads the Model section from here (``SCHEMA["Model"]`` = ``name`` + every
registered key; ``MODEL_KEYS`` = the keys of each family), the config loader rejects a key the
chosen family does not declare, and ``ppvarlen.models.build_model`` hands the builder only those
keys.  A new family: its module under ``ppvarlen/models/`` with a ``build(cfg, vocab_size,
num_labels, pad_id, init_weights)`` function, and one ``register_model`` call below.

This module is paddle-free and builders are named by import path ("module:function"): the
schema needs the keys for ``--help`` and config errors, which must stay instant, while the model
modules import paddle at their top.
"""
from .config_field import Field, ListOf

# name -> ModelFamily, in registration order
MODELS = {}
# every registered Model key -> its Field (a key several families read is declared once)
MODEL_FIELDS = {}


class ModelFamily:
    """One registered model: ``name``, the ``tasks`` it serves, its ``builder`` path, the
    ``keys`` it reads besides ``name`` and the fewest labels it can be built with."""

    def __init__(self, name, tasks, builder, keys, min_labels):
        self.name, self.tasks, self.builder = name, tuple(tasks), builder
        self.keys, self.min_labels = tuple(keys), min_labels

    def serves(self, task):
        return task in self.tasks


def register_model(name, *, tasks, builder, keys, min_labels=1):
    """Register model ``name``: ``tasks`` it serves, ``builder`` ("package.module:function"),
    ``keys`` {key: Field} it reads besides ``name``; ``min_labels`` the fewest labels its
    builder accepts (seq2seq: 0 = every id may be generated)."""
    if name in MODELS:
        raise ValueError(f"register_model: {name!r} is registered twice")
    if ":" not in builder:
        raise ValueError(f"register_model({name!r}): builder {builder!r} is not 'module:function'")
    for key, field in keys.items():
        known = MODEL_FIELDS.setdefault(key, field)
        if known is not field and _shape(known) != _shape(field):
            raise ValueError(f"register_model({name!r}): Model.{key} is declared with another "
                             f"type/default/choices by {_owners(key)}; declare it once and share it")
    MODELS[name] = ModelFamily(name, tasks, builder, keys, min_labels)
    return MODELS[name]


def _shape(field):
    return field.type, field.default, field.choices, field.nullable


def _owners(key):
    return ", ".join(n for n, m in MODELS.items() if key in m.keys)


def model_keys():
    """{model name: the keys it reads besides ``name``}."""
    return {name: family.keys for name, family in MODELS.items()}


# ------------------------------------------------------------------ keys several families read
HIDDEN_SIZE = Field(int, 128, help="width of the encoder (Transformer d_model, RNN hidden units "
                     "per direction)")
NUM_LAYERS = Field(int, 2, help="encoder layers (Transformer blocks or RNN layers)")
NUM_HEADS = Field(int, 4, help="attention heads per Transformer layer")
FFN_SIZE = Field(int, 512, help="inner width of the Transformer feed-forward block")
DROPOUT = Field(float, 0.1, help="dropout probability inside the model")
EMB_SIZE = Field(int, 128, help="token embedding width of the RNN models")
MAX_POSITION = Field(int, 512, help="longest input in tokens: the size of the learned position "
                     "table (transformer_cls, ernie_*, seq2seq); for the RNN models only the cap "
                     "the export and server apply")
POOLING = Field(str, None, choices=["cls", "mean", "max", "last", "mean_max"],
                help="null = the model's default: cls (transformer_cls), last (rnn_cls), mean "
                "(transformer_embed), what the directory says (paddlenlp_embed: "
                "1_Pooling/config.json; cls, mean or last); real tokens only (pads never "
                "pooled); ernie_cls has no such key: it always uses ERNIE's [CLS] pooler")
PRETRAINED_DIR = Field(str, None, path=True, help="local ERNIE/BERT dir: config + weights + vocab; "
                       "paddlenlp_*: any PaddleNLP save_pretrained directory "
                       "(config.json + model.safetensors + tokenizer files)")
INIT_FROM = Field(str, None, path=True, help="warm start: a safetensors file (e.g. the "
                  "encoder.safetensors of tools/pretrain.py) whose weights with matching names "
                  "are loaded into the new model; null = random init")
NGRAM = {
    "ngram_buckets": Field(int, 0, help="hashed char n-gram embedding table size for "
                           "transformer_cls / rnn_cls; 0 = off"),
    "ngram_orders": ListOf(int, [2, 3], help="n-gram orders hashed when ngram_buckets > 0"),
    "ngram_dropout": Field(float, 0.0, help="training only: probability of dropping a whole "
                           "n-gram embedding at a position"),
}
TRANSFORMER = {"hidden_size": HIDDEN_SIZE, "num_layers": NUM_LAYERS, "num_heads": NUM_HEADS,
               "ffn_size": FFN_SIZE, "dropout": DROPOUT, "max_position": MAX_POSITION}
ERNIE = {"pretrained_dir": PRETRAINED_DIR,
         "ernie_config": Field(dict, None, help="small ErnieConfig kwargs for random init"),
         "dropout": DROPOUT, "max_position": MAX_POSITION, "init_from": INIT_FROM}
# any PaddleNLP save_pretrained directory, its own head kept (models/paddlenlp_auto.py)
PADDLENLP = {"pretrained_dir": PRETRAINED_DIR, "max_position": MAX_POSITION}

# ------------------------------------------------------------------------------ the families
register_model(
    "transformer_cls", tasks=["classification", "text_pair"],
    builder="ppvarlen.models.transformer_cls:build",
    keys={**TRANSFORMER, **NGRAM, "pooling": POOLING,
          "wide_buckets": Field(int, 0, help="transformer_cls: hashed char n-gram table of a "
                                "linear 'wide' head whose logits are added to the encoder's; "
                                "0 = off"),
          "wide_orders": ListOf(int, [1, 2, 3], help="n-gram orders of the wide head"),
          "wide_dropout": Field(float, 0.0, help="training only: probability of dropping a "
                                "whole n-gram (all its class logits) from the wide head"),
          "wide_scale": Field(float, 1.0, help="multiplier on the wide logits; under Adam it is "
                              "a learning-rate multiplier for the wide table"),
          "token_dropout": Field(float, 0.0, help="transformer_cls, training only: probability "
                                 "of dropping a whole character embedding (word dropout)"),
          "rdrop_alpha": Field(float, 0.0, help="transformer_cls: R-Drop weight (two dropout "
                               "passes per training step, symmetric KL between them; 2x "
                               "compute); 0 = off. Applies to the model's own loss (not with "
                               "Train.label_smoothing)"),
          "init_from": INIT_FROM,
          "type_vocab_size": Field(int, 0, help="transformer_cls / transformer_span: segment "
                                   "embeddings (a text pair's or a question + context's "
                                   "token_type_ids: 2); 0 = none (single texts)")})
register_model(
    "transformer_span", tasks=["extractive_qa"], builder="ppvarlen.models.token_logits:build",
    keys={**TRANSFORMER, "init_from": INIT_FROM,
          "type_vocab_size": MODEL_FIELDS["type_vocab_size"]})
register_model(
    "rnn_cls", tasks=["classification"], builder="ppvarlen.models.rnn_cls:build",
    keys={"emb_size": EMB_SIZE, "hidden_size": HIDDEN_SIZE, "num_layers": NUM_LAYERS,
          "cell": Field(str, "lstm", choices=["lstm", "gru"], help="rnn_cls: the recurrent cell"), "dropout": DROPOUT,
          "pooling": POOLING, "max_position": MAX_POSITION, "init_from": INIT_FROM, **NGRAM})
register_model(
    "ernie_cls", tasks=["classification"], builder="ppvarlen.models.ernie:build", keys=ERNIE)
register_model(
    "bigru_crf", tasks=["tagging"], builder="ppvarlen.models.bigru_crf:build",
    keys={"emb_size": EMB_SIZE, "hidden_size": HIDDEN_SIZE, "num_layers": NUM_LAYERS,
          "dropout": DROPOUT, "max_position": MAX_POSITION, "init_from": INIT_FROM})
register_model(
    "ernie_tagger", tasks=["tagging"], builder="ppvarlen.models.ernie:build", keys=ERNIE)
register_model(
    "seq2seq", tasks=["seq2seq"], builder="ppvarlen.models.seq2seq:build", min_labels=0,
    keys={**TRANSFORMER,
          "num_decoder_layers": Field(int, 2, help="seq2seq: Transformer decoder layers"),
          "max_len_a": Field(float, 8.0, help="seq2seq: generate at most a * source_len + b "
                             "tokens (EOS included), capped by max_position"),
          "max_len_b": Field(int, 10, help="seq2seq: the b of max_len_a * source_len + b"),
          "beam_size": Field(int, 1, help="seq2seq evaluation: 1 = greedy, > 1 = beam search"),
          "length_penalty": Field(float, 1.0, help="seq2seq beam search: GNMT "
                                  "((5+len)/6)^alpha")})
register_model(
    "paddlenlp_seq_cls", tasks=["classification", "text_pair"],
    builder="ppvarlen.models.paddlenlp_auto:build", keys=PADDLENLP)
register_model(
    "paddlenlp_token_cls", tasks=["tagging"],
    builder="ppvarlen.models.paddlenlp_auto:build", keys=PADDLENLP)
register_model(
    "paddlenlp_qa", tasks=["extractive_qa"],
    builder="ppvarlen.models.paddlenlp_auto:build", keys=PADDLENLP)
register_model(
    "transformer_embed", tasks=["embedding"], builder="ppvarlen.models.embedder:build",
    min_labels=0,
    keys={**TRANSFORMER, "pooling": POOLING, "init_from": INIT_FROM,
          "normalize": Field(bool, None, help="divide each pooled embedding by its L2 norm "
                             "(after pooling, so cosine = dot product); null = the model's "
                             "default: true (transformer_embed), what the directory says "
                             "(paddlenlp_embed: modules.json lists a Normalize module), else "
                             "false"),
          "projection_dim": Field(int, 0, help="transformer_embed: a Linear head from the "
                                  "pooled width to this many dimensions; 0 = none (the "
                                  "embedding is the pooled state)"),
          "temperature": Field(float, 0.05, help="the embedding models, training only: InfoNCE "
                               "temperature (the cosine similarities are divided by it)")})
register_model(
    "paddlenlp_embed", tasks=["embedding"], builder="ppvarlen.models.paddlenlp_auto:build",
    min_labels=0, keys={**PADDLENLP, "pooling": POOLING, "normalize": MODEL_FIELDS["normalize"],
                        "temperature": MODEL_FIELDS["temperature"]})
