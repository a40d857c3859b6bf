"""Fine-tune a PaddleNLP model with paddlenlp's Trainer + ppvarlen's token-budget batching.

    python examples/paddlenlp_trainer_sentiment.py --out output/pnlp_sentiment
    python examples/paddlenlp_trainer_sentiment.py --model-dir DIR --out OUT

Data: ppvarlen's built-in Chinese sentiment corpus (train/dev/test).  Model: a
``save_pretrained`` directory (``--model-dir``: e.g. a downloaded ernie-3.0 model,
read offline; weights from model.safetensors).  Without --model-dir, since no
weights can be downloaded here, a small RANDOM-INIT ERNIE is created from a config
and saved to OUT/init first -- the rest of the script is the same for both.
The trained model and tokenizer end in OUT/model (save_pretrained, safetensors).
"""
import argparse
import json
import os

from paddlenlp.datasets import MapDataset
from paddlenlp.trainer import TrainingArguments
from paddlenlp.transformers import AutoModelForSequenceClassification, AutoTokenizer

from ppvarlen.config import load_config
from ppvarlen.data.sources import load_corpus
from ppvarlen.integrations.paddlenlp_trainer import (LengthBatchingTrainer,
                                                     ModelInputCollator, make_random_model_dir)


def sentiment_splits(limit=None):
    """{split: [{"text", "label"}]} and the label names of the built-in corpus."""
    overrides = ["Data.corpus=sentiment"] + ([f"Data.limit={limit}"] if limit else [])
    corpus = load_corpus(load_config(overrides=overrides).Data)
    return corpus.splits, corpus.label_names


def encode(tokenizer, examples, max_length):
    """Tokenise once, up front: a MapDataset of {input_ids, token_type_ids, label}."""
    rows = []
    for ex in examples:
        enc = tokenizer(ex["text"], max_length=max_length, truncation=True)
        rows.append({"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"],
                     "label": ex["label"]})
    return MapDataset(rows)


def accuracy(pred):
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", help="a PaddleNLP save_pretrained directory (default: a "
                                        "small random-init ERNIE created under OUT/init)")
    ap.add_argument("--out", default="output/pnlp_sentiment")
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per batch")
    ap.add_argument("--epochs", type=float, default=1)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--limit", type=int, help="keep only the first N examples of each split")
    args = ap.parse_args()

    splits, label_names = sentiment_splits(args.limit)
    model_dir = args.model_dir or make_random_model_dir(
        os.path.join(args.out, "init"), [ex["text"] for ex in splits["train"]],
        num_labels=len(label_names))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir,
                                                               num_labels=len(label_names))
    train, dev, test = (encode(tokenizer, splits[s], args.max_length)
                        for s in ("train", "dev", "test"))

    training_args = TrainingArguments(
        output_dir=os.path.join(args.out, "checkpoints"), device="cpu", report_to=[],
        num_train_epochs=args.epochs, learning_rate=args.lr, logging_steps=20,
        evaluation_strategy="epoch", save_strategy="epoch", save_total_limit=1,
        unified_checkpoint=True,  # model and optimizer checkpoints as safetensors
        disable_tqdm=True, seed=42)
    trainer = LengthBatchingTrainer(
        model=model, args=training_args, train_dataset=train, eval_dataset=dev,
        data_collator=ModelInputCollator(tokenizer, model), compute_metrics=accuracy,
        max_tokens=args.max_tokens, eval_max_tokens=4 * args.max_tokens)
    trainer.train()  # add resume_from_checkpoint=True to continue an interrupted run

    results = {"dev": trainer.evaluate(), "test": trainer.predict(test).metrics}
    model_out = os.path.join(args.out, "model")
    model.save_pretrained(model_out, safe_serialization=True)
    tokenizer.save_pretrained(model_out)
    print(json.dumps({"model": model_out, "dev_accuracy": results["dev"]["eval_accuracy"],
                      "test_accuracy": results["test"]["test_accuracy"]}, indent=2))


if __name__ == "__main__":
    main()
