"""Small text-pair and extractive-QA exports for the OIP and ppvarlen-infer tests: the 6-step
random-init runs of tests/tasks/test_text_pair.py and tests/tasks/test_extractive_qa.py (their corpus
derivations and configs, on fewer examples), exported without --verify (those files verify
the exports; here only what the server and ppvarlen-infer answer matters).  About 20 s for both.

Besides the export, each gives mixed-length request items from its test split: short ones,
one over the export's max_len (a pair cut longest-first; a context read in several windows).
"""
import json
import os

import pytest
from test_extractive_qa import qa_cfg
from test_text_pair import derive_pairs, pair_cfg

from ppvarlen.engine import trainer as trainer_mod
from ppvarlen.export.exporter import export_checkpoint
from ppvarlen.tasks.extractive_qa import derive_people_daily_qa


def _lines(path, n):
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x, _ in zip(f, range(n))]


def make_pair_export(root):
    """-> (export dir, corpus paths, mixed-length pairs [[text_a, text_b]])."""
    paths = derive_pairs(os.path.join(root, "corpus"), limit=40)
    run = os.path.join(root, "run")
    trainer_mod.train(pair_cfg(run, paths))
    export_dir = os.path.join(root, "export")
    export_checkpoint(os.path.join(run, "best"), export_dir, verify=False)
    exs = _lines(paths["test"], 5)
    pairs = [[ex["text_a"][:k], ex["text_b"][:k]] for ex, k in zip(exs, (3, 30, 8, 1, 12))]
    pairs.append([exs[0]["text_a"] * 3, exs[1]["text_b"] * 3])  # over max_len 48: cut
    return export_dir, paths, pairs


def make_qa_export(root):
    """-> (export dir, corpus paths, mixed-length items [{question, context}])."""
    paths = derive_people_daily_qa(os.path.join(root, "corpus"), limit=20)
    run = os.path.join(root, "run")
    trainer_mod.train(qa_cfg(run, paths))
    export_dir = os.path.join(root, "export")
    export_checkpoint(os.path.join(run, "best"), export_dir, verify=False)
    exs = _lines(paths["test"], 4)
    items = [{"question": ex["question"], "context": ex["context"] * k}
             for ex, k in zip(exs, (1, 4, 1, 2))]  # max_len 40: the longer ones windowed
    items.append({"question": exs[0]["question"], "context": exs[0]["context"][:2]})
    return export_dir, paths, items


@pytest.fixture(scope="session")
def pair_export(tmp_path_factory):
    return make_pair_export(str(tmp_path_factory.mktemp("pair_export")))


@pytest.fixture(scope="session")
def qa_export(tmp_path_factory):
    return make_qa_export(str(tmp_path_factory.mktemp("qa_export")))
