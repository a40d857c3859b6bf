"""Reference point for the sentiment configs: char 1-3-gram TF-IDF + logistic regression.

    python benchmarks/tfidf_baseline.py [--json output/bench/tfidf_baseline.json]

Same corpus and split as ``Data.corpus: sentiment`` (ppvarlen.data.corpora), so
the neural models' test accuracy can be compared on exactly these examples.
"""
import argparse
import json
import os
import time


def fit_baseline(splits):
    """Char 1-3-gram TF-IDF + LR on ``{split: [{"text", "label"}]}``; C picked on dev.
    -> (test predictions as an int array, {"C", "dev_accuracy"})."""
    import numpy as np
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    text = {k: [e["text"] for e in v] for k, v in splits.items()}
    gold = {k: np.array([e["label"] for e in v]) for k, v in splits.items()}
    vec = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True, min_df=2)
    x_train = vec.fit_transform(text["train"])
    x_dev = vec.transform(text["dev"])
    best = None
    for c in (1.0, 3.0, 10.0):  # C picked on dev, test read once
        clf = LogisticRegression(C=c, max_iter=2000).fit(x_train, gold["train"])
        dev_acc = float((clf.predict(x_dev) == gold["dev"]).mean())
        if best is None or dev_acc > best[0]:
            best = (dev_acc, c, clf)
    dev_acc, c, clf = best
    return clf.predict(vec.transform(text["test"])), {"C": c, "dev_accuracy": dev_acc}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="output/bench/tfidf_baseline.json")
    args = ap.parse_args()
    from sklearn.metrics import accuracy_score, f1_score

    from ppvarlen.config import load_config
    from ppvarlen.data.sources import load_corpus

    corpus = load_corpus(load_config(data={"Data": {"corpus": "sentiment"}}).Data)
    t0 = time.time()
    pred, fit = fit_baseline(corpus.splits)
    gold = [e["label"] for e in corpus.splits["test"]]
    result = {"model": "char 1-3gram tfidf + logistic regression", "C": fit["C"],
              "dev_accuracy": fit["dev_accuracy"], "test_accuracy": accuracy_score(gold, pred),
              "test_macro_f1": f1_score(gold, pred, average="macro"),
              "sizes": {k: len(v) for k, v in corpus.splits.items()}, "seconds": round(time.time() - t0, 1)}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
