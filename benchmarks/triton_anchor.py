"""The Triton side of benchmarks/serve_vs_triton.py and benchmarks/embed_vs_triton.py: one
ppvarlen export (a text classifier or an embedding model) served by Triton.

Runs in a venv of its own with PyTriton, onnxruntime and numpy (no ppvarlen, no Paddle); the
benchmark starts it as a subprocess:

    /tmp/tritonvenv/bin/python benchmarks/triton_anchor.py --model-dir EXPORT \\
        --http-port 8000 --grpc-port 8001 [--max-wait-ms 5] [--max-batch-size 64] [--threads 1]
    /tmp/tritonvenv/bin/python benchmarks/triton_anchor.py --model-dir EXPORT \\
        --encode texts.json --ids-out ids.json          # tokenise only (the start-up check)

The model is what a Triton user writes for such an export: a Python function behind Triton's
dynamic batcher that tokenises the batch's texts from the export's own files (vocab.txt,
encoder.json, manifest.json: the char or word tokenizer, [CLS] text [SEP], the head kept up
to max_len), pads the batch to its longest text and runs the export's onnx/model.onnx in ONNX
Runtime.  The tokenizer is written here from those files alone; the benchmark compares its ids
with ppvarlen's own on every input text and refuses to measure when one differs.  The input
and outputs carry the names and values of ppvarlen-serve's Open Inference Protocol model
(``text`` BYTES in; a classifier's ``label``, ``label_id``, ``probs``, ``num_tokens``,
``truncated`` out, an embedding model's ``embedding`` FP32 [B, D], ``num_tokens`` (special
tokens excluded, as ppvarlen counts them there), ``truncated``), so one perf_analyzer input
file drives both servers.  Both listeners bind 127.0.0.1 only.
"""
import argparse
import json
import os
import re
import signal
import sys

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[BOS]", "[EOS]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID = 0, 1, 2, 3
# vocab.txt escapes (encoder.json "vocab_escape": "backslash"): \\ and \uXXXX / \UXXXXXXXX
_ESCAPE = re.compile(r"\\(?:(\\)|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))")
# Triton keeps these behind an access token by default; only "statistics" is opened here,
# because perf_analyzer reads the server-side numbers from it
RESTRICTED_ENDPOINTS = ["shared-memory", "model-repository", "trace", "logging"]
# what the model gives, by the export's one output: the kinds of model the anchor serves
MODEL_KINDS = {"logits": "classifier", "embedding": "embedding"}


class UnsupportedExport(ValueError):
    """The anchor cannot tokenise this export the way ppvarlen does; the message says why."""


def _unescape(line):
    def one(m):
        if m.group(1):
            return "\\"
        return chr(int(m.group(2) or m.group(3), 16))
    return _ESCAPE.sub(one, line)


def _read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class AnchorTokenizer:
    """Text -> ids for a classifier or embedding export with ppvarlen's own vocabulary (char
    or word).

    Read from the export's files, not from ppvarlen: a literal "[CLS]" in a text is unknown
    (special tokens are never looked up), ``lowercase`` lowers the text first, a text with
    more than ``max_len - 2`` tokens keeps its first ones (the ``truncate`` policy)."""

    def __init__(self, export_dir):
        manifest = _read_json(os.path.join(export_dir, "manifest.json"))
        # what the anchor runs: one text's ids and length in, one row out (label logits or
        # the embedding)
        inputs = [i.get("name") for i in manifest.get("inputs", [])]
        outputs = [o.get("name") for o in manifest.get("outputs", [])]
        if inputs != ["input_ids", "seq_len"] or len(outputs) != 1 or \
                outputs[0] not in MODEL_KINDS:
            raise UnsupportedExport(f"the model takes {inputs} and gives {outputs}; the anchor "
                                    f"runs models of input_ids + seq_len -> logits (a text "
                                    f"classifier) or -> embedding only")
        self.model_kind = MODEL_KINDS[outputs[0]]
        self.dim = int(manifest["embedding"]["dim"]) if self.model_kind == "embedding" else None
        tok = manifest["tokenizer"] if isinstance(manifest["tokenizer"], dict) \
            else {"kind": manifest["tokenizer"]}
        meta_path = os.path.join(export_dir, "encoder.json")
        meta = _read_json(meta_path) if os.path.isfile(meta_path) else {}
        self.kind = meta.get("kind") or tok.get("kind") or "char"
        if self.kind not in ("char", "word"):
            raise UnsupportedExport(f"tokenizer kind {self.kind!r}: the anchor reads ppvarlen's "
                                    f"own char/word vocabularies only")
        self.lowercase = bool(meta.get("lowercase", tok.get("lowercase", False)))
        special = tok.get("add_special_tokens")
        self.add_special_tokens = True if special is None else bool(special)
        policy = manifest["long_text"]
        policy = policy if isinstance(policy, str) else policy["policy"]
        if policy != "truncate":
            raise UnsupportedExport(f"long_text policy {policy!r}: the anchor only truncates")
        self.max_len = int(manifest["max_len"])
        self.label_names = list(manifest.get("label_names") or [])
        with open(os.path.join(export_dir, "vocab.txt"), encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if meta.get("vocab_escape") == "backslash":
            lines = [_unescape(t) for t in lines]
        if tuple(lines[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise UnsupportedExport(f"vocab.txt does not start with {list(SPECIAL_TOKENS)}")
        self.ids = {t: i for i, t in enumerate(lines) if i >= len(SPECIAL_TOKENS)}

    def encode(self, text):
        """(ids with [CLS]/[SEP], truncated?) for one text."""
        if self.lowercase:
            text = text.lower()
        tokens = list(text) if self.kind == "char" else text.split()
        if not tokens:
            raise ValueError("text has no tokens")
        ids = [self.ids.get(t, UNK_ID) for t in tokens]
        room = self.max_len - (2 if self.add_special_tokens else 0)
        truncated = len(ids) > room
        ids = ids[:room]
        if self.add_special_tokens:
            ids = [CLS_ID] + ids + [SEP_ID]
        return ids, truncated


def pad_batch(id_lists):
    """(input_ids [B, longest], seq_len [B]) int64, padded with [PAD] on the right."""
    seq_len = np.array([len(x) for x in id_lists], dtype=np.int64)
    input_ids = np.full((len(id_lists), int(seq_len.max())), PAD_ID, dtype=np.int64)
    for row, ids in enumerate(id_lists):
        input_ids[row, :len(ids)] = ids
    return input_ids, seq_len


def softmax(logits):
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


class OnnxModel:
    """The export's onnx/model.onnx in ONNX Runtime, with the session settings ppvarlen uses
    for it (``threads`` intra-op threads, 1 inter-op thread, the manifest's disabled graph
    optimizers)."""

    def __init__(self, export_dir, threads):
        import onnxruntime as ort

        manifest = _read_json(os.path.join(export_dir, "manifest.json"))
        entry = manifest["backends"]["onnx"]
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(threads)
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        disabled = list(entry.get("session", {}).get("disabled_optimizers", []))
        self.session = ort.InferenceSession(
            os.path.join(export_dir, entry.get("model", "onnx/model.onnx")), opts,
            providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.settings = {"intra_op_threads": int(threads), "inter_op_threads": 1,
                         "disabled_optimizers": disabled, "onnxruntime": ort.__version__}

    def forward(self, input_ids, seq_len):
        """The model's one output ([B, labels] logits or [B, D] embeddings), float32."""
        feeds = dict(zip(self.input_names, (input_ids, seq_len)))
        return self.session.run(None, feeds)[0].astype(np.float32)


def make_infer(tokenizer, model):
    """The batch function: texts [B, 1] bytes -> ppvarlen's outputs for the export, one row
    per text."""
    return (make_embed_infer if tokenizer.model_kind == "embedding" else make_classify_infer)(
        tokenizer, model)


def make_classify_infer(tokenizer, classifier):
    """texts [B, 1] bytes -> a classifier's five outputs."""
    labels = np.array([n.encode("utf-8") for n in tokenizer.label_names], dtype=object)

    def infer(text):
        encoded = [tokenizer.encode(row[0].decode("utf-8")) for row in text]
        input_ids, seq_len = pad_batch([ids for ids, _ in encoded])
        probs = softmax(classifier.forward(input_ids, seq_len).astype(np.float64))
        best = probs.argmax(axis=1)
        return {"label": labels[best].reshape(-1, 1),
                "label_id": best.astype(np.int64).reshape(-1, 1),
                "probs": probs.astype(np.float32),
                "num_tokens": seq_len.reshape(-1, 1),
                "truncated": np.array([[t] for _, t in encoded], dtype=np.bool_)}
    return infer


def make_embed_infer(tokenizer, embedder):
    """texts [B, 1] bytes -> ``embedding`` [B, D] float32, ``num_tokens`` without the special
    tokens, ``truncated``."""
    specials = 2 if tokenizer.add_special_tokens else 0

    def infer(text):
        encoded = [tokenizer.encode(row[0].decode("utf-8")) for row in text]
        input_ids, seq_len = pad_batch([ids for ids, _ in encoded])
        return {"embedding": embedder.forward(input_ids, seq_len),
                "num_tokens": (seq_len - specials).reshape(-1, 1),
                "truncated": np.array([[t] for _, t in encoded], dtype=np.bool_)}
    return infer


def output_tensors(tokenizer):
    """PyTriton's output declarations, per row, named and ordered as ppvarlen's OIP answer."""
    from pytriton.model_config import Tensor

    if tokenizer.model_kind == "embedding":
        head = [Tensor(name="embedding", dtype=np.float32, shape=(tokenizer.dim,))]
    else:
        head = [Tensor(name="label", dtype=bytes, shape=(1,)),
                Tensor(name="label_id", dtype=np.int64, shape=(1,)),
                Tensor(name="probs", dtype=np.float32, shape=(len(tokenizer.label_names),))]
    return head + [Tensor(name="num_tokens", dtype=np.int64, shape=(1,)),
                   Tensor(name="truncated", dtype=np.bool_, shape=(1,))]


def serve(args):
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    tokenizer = AnchorTokenizer(args.model_dir)
    model = OnnxModel(args.model_dir, args.threads)
    infer = batch(make_infer(tokenizer, model))
    config = TritonConfig(http_address="127.0.0.1", http_port=args.http_port,
                          grpc_address="127.0.0.1", grpc_port=args.grpc_port,
                          allow_metrics=False, log_verbose=0)
    security = TritonSecurityConfig(restricted_endpoints=list(RESTRICTED_ENDPOINTS))
    batcher = DynamicBatcher(max_queue_delay_microseconds=int(round(args.max_wait_ms * 1000)))
    with Triton(config=config, security_config=security) as triton:
        triton.bind(model_name=args.model_name, infer_func=infer,
                    inputs=[Tensor(name="text", dtype=bytes, shape=(-1,))],
                    outputs=output_tensors(tokenizer),
                    config=ModelConfig(max_batch_size=args.max_batch_size, batcher=batcher),
                    strict=True)
        print(json.dumps({"anchor": "ready", "model": args.model_name,
                          "http_port": args.http_port, "grpc_port": args.grpc_port,
                          "model_kind": tokenizer.model_kind,
                          "onnx_session": model.settings}), flush=True)
        # SIGTERM as Ctrl-C: serve() returns on KeyboardInterrupt and the context manager stops
        # Triton and its stub (installed here, once PyTriton's start-up has run)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        triton.serve()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--model-name", default=None, help="default: the manifest's model_name")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--max-wait-ms", type=float, default=5.0,
                        help="Triton's max_queue_delay (ppvarlen's Deploy.max_wait_ms)")
    parser.add_argument("--max-batch-size", type=int, default=64,
                        help="Triton's max_batch_size (ppvarlen's Deploy.max_batch_size)")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    parser.add_argument("--encode", help="JSON list of texts: write their ids (--ids-out), exit")
    parser.add_argument("--ids-out", help="where --encode writes [[ids], ...]")
    args = parser.parse_args(argv)
    if args.encode:
        tokenizer = AnchorTokenizer(args.model_dir)
        with open(args.encode, encoding="utf-8") as f:
            texts = json.load(f)
        ids = [tokenizer.encode(t)[0] for t in texts]
        with open(args.ids_out, "w", encoding="utf-8") as f:
            json.dump(ids, f)
        return 0
    if args.model_name is None:
        args.model_name = _read_json(os.path.join(args.model_dir, "manifest.json")).get(
            "model_name") or "model"
    serve(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
