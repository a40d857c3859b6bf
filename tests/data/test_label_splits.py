"""Labels checked across splits: a class label (a tag type) in a dev/test file that the train file
never has is refused naming file:line and the nearest train label, unless a key allows it."""
import pytest

from ppvarlen.data.errors import DataError
from ppvarlen.data.readers import label_set_line
from ppvarlen.data.sources import load_corpus


def _write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
    return str(path)


def _reviews(tmp_path, dev_typo):
    train = _write(tmp_path, "train.tsv", ["text\tlabel"] + [
        f"第{i}条评论\t{'正面' if i % 2 else '负面'}" for i in range(12)])
    dev = _write(tmp_path, "dev.tsv", ["text\tlabel", "很好\t正面", "太差\t负面",
                                       f"还行\t{dev_typo}"])
    return train, dev


def test_dev_only_label_refused_with_the_nearest_train_label(tmp_path):
    train, dev = _reviews(tmp_path, "正靣")
    with pytest.raises(DataError, match=r"dev\.tsv:4: label '正靣' is not in the train file, "
                                        r"which has 2: '正面', '负面'; did you mean '正面'\?.*"
                                        r"Data\.allow_eval_only_labels"):
        load_corpus({"corpus": "tsv", "train_file": train, "dev_file": dev})
    # meant: allowed by the key (a class train never shows), or pinned by Data.label_names
    c = load_corpus({"corpus": "tsv", "train_file": train, "dev_file": dev,
                     "allow_eval_only_labels": True})
    assert c.label_names == sorted(["正靣", "正面", "负面"])
    with pytest.raises(DataError, match=r"dev\.tsv:4: label '正靣' is not one of the 2 classes"):
        load_corpus({"corpus": "tsv", "train_file": train, "dev_file": dev,
                     "label_names": ["正面", "负面"]})


def test_dev_only_tag_type_refused_with_the_nearest_train_type(tmp_path):
    row = ('{"tokens": ["江", "泽", "民", "在", "北", "京"], '
           '"tags": ["B-PER", "I-PER", "I-PER", "O", "B-LOC", "I-LOC"]}')
    train = _write(tmp_path, "train.jsonl", [row] * 6)
    typo = row.replace("B-PER", "B-PRE").replace("I-PER", "I-PRE")
    dev = _write(tmp_path, "dev.jsonl", [row, typo])
    with pytest.raises(DataError, match=r"dev\.jsonl:2: tag type 'PRE' is not in the train file.*"
                                        r"did you mean 'PER'\?"):
        load_corpus({"corpus": "jsonl", "train_file": train, "dev_file": dev})
    c = load_corpus({"corpus": "jsonl", "train_file": train, "dev_file": dev,
                     "allow_eval_only_labels": True})
    assert "B-PRE" in c.label_names


def test_label_set_line_names_the_classes_in_id_order():
    assert label_set_line(["neg", "pos"]) == "labels (2, ids in this order): neg, pos"
    assert label_set_line([str(i) for i in range(50)], shown=3) == \
        "labels (50, ids in this order): 0, 1, 2, ... (47 more)"


def test_training_logs_the_label_set_at_its_start(tmp_path, capsys):
    from ppvarlen.config import load_config
    from ppvarlen.engine import train as train_run

    train, dev = _reviews(tmp_path, "正面")
    cfg = load_config("configs/sentiment/bilstm.yaml", [
        "Data.corpus=tsv", f"Data.train_file={train}", f"Data.dev_file={dev}",
        f"Global.output_dir={tmp_path / 'run'}", "Train.max_steps=1", "Train.epochs=1",
        "Train.progress_bar=false", f"Data.cache_dir={tmp_path / 'cache'}"])
    train_run(cfg)
    assert "labels (2, ids in this order): 正面, 负面" in capsys.readouterr().err


def test_one_file_read_as_train_and_test_reports_no_overlap(tmp_path):
    path = _write(tmp_path, "verify.tsv", [f"第{i}条\t{'正面' if i % 2 else '负面'}"
                                           for i in range(40)])
    c = load_corpus({"corpus": "tsv", "train_file": path, "test_file": path})
    assert "texts_in_two_splits" not in c.stats["split"]  # one verify file: not a leak
