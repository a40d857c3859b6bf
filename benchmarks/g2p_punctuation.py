"""How a g2p export does on sources without their final punctuation, next to the test split itself.

    python benchmarks/g2p_punctuation.py --model-dir output/export/g2p [--backend onnx|paddle]
        [--json output/bench/g2p_punctuation.json]

Corpus clauses almost always end in "，" or "。"; what users send often does not.  This decodes
the test split as it is, then every test clause that ends in clause punctuation with that
punctuation removed (its reference loses the matching last token), and prints sequence accuracy
and syllable error rate of both, plus a few everyday phrases.  The export must come from
``configs/g2p/transformer.yaml`` (or another ``Data.corpus: g2p`` config): the test split is
rebuilt from the manifest's source limit.
"""
import argparse
import json
import os
import time

PHRASES = ["你好", "今天天气不错", "我爱北京天安门", "经济发展很快", "银行行长"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True, help="a g2p export directory")
    ap.add_argument("--backend", choices=["onnx", "paddle"], default="onnx")
    ap.add_argument("--max-target-len", type=int, default=96, help="Data.max_target_len of the run")
    ap.add_argument("--json", default="output/bench/g2p_punctuation.json")
    args = ap.parse_args()
    from ppvarlen.data.sources import load_corpus
    from ppvarlen.data.g2p import without_final_punctuation
    from ppvarlen.runtime.predictor import Predictor
    from ppvarlen.tasks.seq2seq_metrics import seq2seq_metrics

    predictor = Predictor(args.model_dir, args.backend)
    if not predictor.task.generates:
        raise SystemExit(f"error: {args.model_dir} is a {predictor.task.name} export; give a g2p "
                         f"export")
    corpus = load_corpus({"corpus": "g2p", "max_source_len": predictor.max_len,
                          "max_target_len": args.max_target_len})
    test = [(ex["source"], ex["target"]) for ex in corpus.splits["test"]]
    result = {"model_dir": args.model_dir, "backend": args.backend, "sets": {}}
    stripped = [p for p in (without_final_punctuation(s, t) for s, t in test) if p is not None]
    for name, pairs in (("test", test), ("test without final punctuation", stripped)):
        t0 = time.time()
        hyps = [r["output"] for r in predictor.predict([s for s, _ in pairs])]
        metrics = seq2seq_metrics(hyps, [t for _, t in pairs])
        result["sets"][name] = {**metrics, "seconds": round(time.time() - t0, 1)}
        print(f"{name:32s} {metrics['num_examples']:6d} clauses  sequence accuracy "
              f"{metrics['seq_acc']:.4f}  syllable error rate {metrics['ter']:.4f}", flush=True)
    result["phrases"] = {p: r["output"] for p, r in zip(PHRASES, predictor.predict(PHRASES))}
    for phrase, output in result["phrases"].items():
        print(f"  {phrase} -> {output}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=2)


if __name__ == "__main__":
    main()
