"""``ppvarlen-export --pretrained-dir DIR --verify-file FILE``: a labelled .tsv / .csv (a
classification export) or .conll (a tagging export) is read as training reads it (columns by
name) into the parity report's test batches; a file whose format cannot hold the export's examples
is refused naming the file and the formats that can."""
import json

import pytest

from ppvarlen.cli import main_export

TEXTS = ["很好的酒店", "太差了", "北京欢迎你", "上海, 广州", "房间干净"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """{"seq": a tiny random sequence-classification dir, "token": a token-classification one}
    (PaddleNLP save_pretrained layout; labels LABEL_0, LABEL_1, ...)."""
    from ppvarlen.integrations.paddlenlp_trainer import make_random_model_dir

    root = tmp_path_factory.mktemp("pretrained")
    dirs = {}
    for head, labels in (("sequence", 2), ("token", 3)):
        dirs[head] = str(root / head)
        make_random_model_dir(dirs[head], TEXTS, labels, task=head, vocab_size=40,
                              hidden_size=16, num_layers=1, num_heads=2, max_position=64)
    return dirs


def _export(model_dir, verify_file, tmp_path, *flags):
    return main_export(["--pretrained-dir", model_dir, "--output", str(tmp_path / "export"),
                        "--verify-file", str(verify_file), "--format", "paddle",
                        "--precision", "fp32", "-o", f"Data.cache_dir={tmp_path / 'cache'}",
                        *flags])


def _parity(tmp_path):
    return json.loads((tmp_path / "export" / "parity.json").read_text(encoding="utf-8"))


LABELLED = {
    # label first: the header says which column is which; a quoted text holds a comma and a
    # line end (one record over two lines)
    "tsv": "label\ttext\n" + "".join(f"LABEL_{k % 2}\t{t}\n" for k, t in enumerate(TEXTS)),
    "csv": "review,label\n" + "".join(f'"{t}",LABEL_{k % 2}\n' for k, t in enumerate(TEXTS[:4]))
           + '"房间干净,\n早餐丰富",LABEL_1\n',
}


@pytest.mark.parametrize("fmt", sorted(LABELLED))
def test_a_labelled_table_verifies_a_classification_export(fmt, model_dirs, tmp_path):
    verify = tmp_path / f"labelled.{fmt}"
    verify.write_text(LABELLED[fmt], encoding="utf-8")
    assert _export(model_dirs["sequence"], verify, tmp_path) == 0
    parity = _parity(tmp_path)
    assert parity["passed"] and parity["metric_gate"]["examples"] == len(TEXTS)
    assert parity["results"]["test"]["static"]["compared"] == len(TEXTS)


def test_a_conll_file_verifies_a_tagging_export(model_dirs, tmp_path):
    sentences = [TEXTS[0], TEXTS[2], TEXTS[4]]
    verify = tmp_path / "labelled.conll"
    verify.write_text("\n".join("".join(f"{c}\tLABEL_{k % 3}\n" for k, c in enumerate(s))
                                for s in sentences), encoding="utf-8")
    assert _export(model_dirs["token"], verify, tmp_path) == 0
    parity = _parity(tmp_path)
    assert parity["passed"] and parity["metric_gate"]["examples"] == len(sentences)
    # every token of every sentence, and the [CLS] and [SEP] around it
    assert parity["results"]["test"]["static"]["compared"] == sum(len(s) + 2 for s in sentences)


@pytest.mark.parametrize("head, name, says", [
    ("sequence", "labelled.conll", "a conll file cannot hold them"),
    ("token", "labelled.tsv", "a tsv file cannot hold them"),
    ("token", "labelled.csv", "a csv file cannot hold them"),
    ("sequence", "labelled.txt", "cannot tell the format of .txt"),
])
def test_a_format_that_cannot_hold_the_examples_is_refused(head, name, says, model_dirs,
                                                           tmp_path, capsys):
    verify = tmp_path / name
    verify.write_text("北 LABEL_0\n京 LABEL_1\n", encoding="utf-8")
    assert _export(model_dirs[head], verify, tmp_path, "--no-verify") == 2
    err = capsys.readouterr().err
    task = {"sequence": "classification", "token": "tagging"}[head]
    suffixes = {"classification": ".jsonl, .json, .tsv, .csv, .parquet",
                "tagging": ".jsonl, .json, .conll, .bio, .iob, .parquet"}[task]
    assert f"--verify-file {verify}: a {task} export is verified on labelled {task} examples" \
        in err
    assert f"told by the suffix: {suffixes} (or the same + .gz); {says}" in err
    assert "Traceback" not in err and not (tmp_path / "export").exists()
