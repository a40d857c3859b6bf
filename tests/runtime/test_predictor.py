"""Predictor from an export dir: both backends equal the dygraph model; policies; tampering."""
import errno
import json
import os
import shutil
import threading

import numpy as np
import pytest
from export_helpers import (NER_TAGS, TEXTS, cls_export, reference,  # noqa: F401
                                 reference_ids, tag_export)

import ppvarlen.utils.io as uio
from ppvarlen.data.errors import DataError
from ppvarlen.runtime.manifest import UnservableExportError
from ppvarlen.runtime.predictor import Predictor, char_spans
from ppvarlen.tasks.tagging import TaggingTask, entities

MAX_LEN = 16
LONG = "这是一段非常非常非常非常非常非常长的文本，超过了最大长度好几倍呢"  # > MAX_LEN chars
MIXED = TEXTS + [LONG, "好", "北京"]


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("backend", ["paddle", "onnx"])
def test_classification_equals_dygraph_in_input_order(cls_export, backend):  # noqa: F811
    export_dir, model, encoder = cls_export
    ref = reference(model, encoder, "classification", MIXED, MAX_LEN)
    # a small budget forces several length-sorted batches, each padded differently
    p = Predictor(export_dir, backend, max_batch_tokens=MAX_LEN * 2, max_batch_size=3)
    got = p.predict(MIXED)
    assert len(got) == len(MIXED)
    for g, r in zip(got, ref):
        assert g["label_id"] == int(np.argmax(r))
        assert g["label"] == ["negative", "positive"][g["label_id"]]
        np.testing.assert_allclose(list(g["probs"].values()), _softmax(r), atol=1e-5)
    assert [g["truncated"] for g in got] == [t is LONG for t in MIXED]
    assert 0 < p.real_tokens / p.padded_tokens < 1  # mixed lengths in a batch: some padding


@pytest.mark.parametrize("backend", ["paddle", "onnx"])
def test_tagging_equals_dygraph_tags(tag_export, backend):  # noqa: F811
    export_dir, model, encoder = tag_export
    ref = reference(model, encoder, "tagging", MIXED, MAX_LEN)
    got = Predictor(export_dir, backend, max_batch_tokens=MAX_LEN * 3).predict(MIXED)
    for text, g, r in zip(MIXED, got, ref):
        assert g["tags"] == [NER_TAGS[i] for i in r], text
        for e in g["entities"]:
            assert text[e["start"]:e["end"]] == e["text"]


def test_entities_have_char_offsets():
    text = "江泽民在北京 会见"
    spans = char_spans(text, list(text))
    tags = ["B-PER", "I-PER", "I-PER", "O", "B-LOC", "I-LOC", "O", "I-ORG", "B-ORG"]
    assert entities(tags, spans, text, "bio") == ([
        {"type": "PER", "text": "江泽民", "start": 0, "end": 3},
        {"type": "LOC", "text": "北京", "start": 4, "end": 6},
        {"type": "ORG", "text": "会", "start": 7, "end": 8},   # I- without B- starts one
        {"type": "ORG", "text": "见", "start": 8, "end": 9}], 1)  # ... and is counted
    # the same text tagged in BIOES and BMES (untyped word segmentation), and plain tags
    bioes = ["B-PER", "I-PER", "E-PER", "O", "B-LOC", "E-LOC", "O", "S-ORG", "S-ORG"]
    assert entities(bioes, spans, text, "bioes") == (entities(tags, spans, text, "bio")[0], 0)
    words, repaired = entities(["B", "M", "E", "S", "B", "E", "S", "B", "E"], spans, text, "bmes")
    assert [w["text"] for w in words] == ["江泽民", "在", "北京", " ", "会见"] and repaired == 0
    assert {w["type"] for w in words} == {None}  # untyped words: null, not ""
    assert entities(["nr", "nr", "nr", "p", "ns", "ns", "w", "v", "v"], spans, text, "plain") == (
        [], 0)


def test_a_weak_models_bmes_tags_are_read_by_conllevals_rule_and_counted():
    """B B B E E E E: each B opens a word, an E that does not continue one is a one-character
    word of its own; the 5 words that needed the rule are counted (docs/TAGGING.md)."""
    text = "一二三四五六七"
    words, repaired = entities(list("BBBEEEE"), char_spans(text, list(text)), text, "bmes")
    assert [w["text"] for w in words] == ["一", "二", "三四", "五", "六", "七"]
    assert repaired == 5
    task = TaggingTask()
    answers = [{"repaired_chunks": 5}, {"repaired_chunks": 0}, {"repaired_chunks": 1}]
    assert task.answer_counts(answers) == {"tag_sequences_repaired": 2, "tag_chunks_repaired": 6}


    # lower-cased word pieces still map back onto the original text
    assert char_spans("Hello World", ["hello", "wor", "##ld"], lowercase=True) == [
        (0, 5), (6, 9), (9, 11)]


def _with_policy(src, dst, policy, stride=4):
    """Copy an export and change only its long-text policy (the manifest is not hashed)."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, "manifest.json")
    m = json.load(open(path, encoding="utf-8"))
    m["long_text"] = {"policy": policy, "stride": stride, "max_len": m["max_len"]}
    json.dump(m, open(path, "w", encoding="utf-8"))
    return dst


def test_window_policy_aggregates_windows(cls_export, tag_export, tmp_path):  # noqa: F811
    from ppvarlen.data.longtext import plan_spans

    export_dir, model, encoder = cls_export
    p = Predictor(_with_policy(export_dir, str(tmp_path / "cls"), "window"), "paddle")
    got = p.predict([LONG])[0]
    assert not got["truncated"]
    ids = encoder.encode(encoder.tokenize(LONG))
    spans = plan_spans(len(ids), MAX_LEN - 2, "window", 4, "test")
    assert len(spans) > 1
    windows = [[encoder.cls_id] + ids[s:e] + [encoder.sep_id] for s, e in spans]
    logits = reference_ids(model, windows, "classification")
    np.testing.assert_allclose(list(got["probs"].values()), _softmax(np.mean(logits, 0)), atol=1e-5)

    tag_dir, _, _ = tag_export
    tags = Predictor(_with_policy(tag_dir, str(tmp_path / "tag"), "window"), "onnx").predict([LONG])
    assert len(tags[0]["tags"]) == len(LONG) and not tags[0]["truncated"]


@pytest.mark.parametrize("policy", ["window", "truncate"])
def test_a_served_text_is_cut_and_wrapped_as_its_store_items(cls_export, tmp_path,  # noqa: F811
                                                             policy):
    """Train/serve parity of the window rule (``data.longtext.text_windows``): the predictor's
    rows of a long text are the input_ids the store holds for it."""
    from ppvarlen.tasks.base import EncodeContext
    from ppvarlen.tasks.classification import ClassificationTask

    export_dir, _, encoder = cls_export
    p = Predictor(_with_policy(export_dir, str(tmp_path / policy), policy, stride=3), "onnx")
    served = p.encode(LONG)
    assert p.add_special_tokens  # the wrapping is part of what is compared
    ctx = EncodeContext(encoder, MAX_LEN, policy, 3, p.add_special_tokens, {})
    items, _ = ClassificationTask().encode_example(ctx, {"text": LONG, "label": 0}, 0, "t")
    assert [list(w) for w in served.windows] == [it["input_ids"].tolist() for it in items]
    assert len(items) == (1 if policy == "truncate" else len(served.windows)) and \
        (len(items) > 1) == (policy == "window")


def test_error_policy_refuses_long_text_only(cls_export, tmp_path):  # noqa: F811
    p = Predictor(_with_policy(cls_export[0], str(tmp_path / "e"), "error"), "onnx")
    assert p.predict(["好"])[0]["label"] in ("negative", "positive")
    with pytest.raises(DataError, match=r"text 1: .*tokens.*long_text policy is 'error'"):
        p.predict(["好", LONG])


def test_bad_texts_are_refused_clearly(cls_export):  # noqa: F811
    p = Predictor(cls_export[0], "onnx")
    with pytest.raises(DataError, match="text 0: text is empty"):
        p.predict(["   "])
    with pytest.raises(DataError, match="must be a string"):
        p.predict([None])


def test_tampered_or_incomplete_export_is_refused(cls_export, tmp_path):  # noqa: F811
    src = cls_export[0]
    bad = str(tmp_path / "tampered")
    shutil.copytree(src, bad)
    with open(os.path.join(bad, "paddle", "model.pdiparams"), "r+b") as f:
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(UnservableExportError, match="model.pdiparams: sha256 .* does not match"):
        Predictor(bad, "paddle")

    swapped = str(tmp_path / "swapped_vocab")
    shutil.copytree(src, swapped)
    with open(os.path.join(swapped, "vocab.txt"), "a", encoding="utf-8") as f:
        f.write("多\n")
    with pytest.raises(UnservableExportError, match="vocab.txt: sha256"):
        Predictor(swapped, "onnx")

    unlisted = str(tmp_path / "unlisted")
    shutil.copytree(src, unlisted)
    path = os.path.join(unlisted, "manifest.json")
    m = json.load(open(path, encoding="utf-8"))
    del m["files"]["onnx/model.onnx"]
    json.dump(m, open(path, "w", encoding="utf-8"))
    with pytest.raises(UnservableExportError, match="no sha256"):
        Predictor(unlisted, "onnx")

    m["files"]["../outside"] = "0" * 64
    json.dump(m, open(path, "w", encoding="utf-8"))
    with pytest.raises(UnservableExportError, match="inside the export directory"):
        Predictor(unlisted, "paddle")

    os.remove(path)
    with pytest.raises(UnservableExportError, match="manifest.json is missing"):
        Predictor(unlisted, "paddle")


def test_a_listed_file_that_cannot_be_read_is_refused_naming_it_and_why(cls_export, tmp_path,  # noqa: F811
                                                                          monkeypatch):
    """No read permission (or an I/O error) on a listed file is an UnservableExportError naming
    the file and the system's reason, not a PermissionError from deep in the hashing."""
    export = str(tmp_path / "unreadable")
    shutil.copytree(cls_export[0], export)
    vocab = os.path.join(export, "vocab.txt")
    os.chmod(vocab, 0)
    if os.geteuid() == 0:  # root reads a mode-0 file: the kernel's answer to anyone else
        real_open = uio.open_regular

        def open_as_a_user(path):
            if os.path.realpath(path) == os.path.realpath(vocab):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
            return real_open(path)
        monkeypatch.setattr(uio, "open_regular", open_as_a_user)
    with pytest.raises(UnservableExportError,
                       match=r"vocab.txt: listed in the manifest but cannot be read \(Permission "
                             r"denied\); copy the export's files themselves, readable by the user"):
        Predictor(export, "onnx")


def test_a_file_changed_after_a_load_is_refused_at_the_next_one(cls_export, tmp_path,  # noqa: F811
                                                                monkeypatch):
    """A process hashes an unchanged file once (auto's candidates, reloads read nothing twice),
    but a file written in place since, even to the same size with its mtime set back, is
    hashed again and refused."""
    from ppvarlen.runtime import manifest as manifest_module

    export = str(tmp_path / "export")
    shutil.copytree(cls_export[0], export)
    hashed = []
    real = manifest_module.sha256_file
    monkeypatch.setattr(manifest_module, "sha256_file", lambda path: hashed.append(path)
                        or real(path))
    Predictor(export, "onnx")
    first = len(hashed)
    assert first >= 3  # every listed file
    Predictor(export, "onnx")
    assert len(hashed) == first  # nothing read twice
    weights = os.path.join(export, "onnx", "model.onnx")
    st = os.stat(weights)
    with open(weights, "r+b") as f:
        f.seek(st.st_size // 2)
        byte = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([byte[0] ^ 1]))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and mtime as they were
    with pytest.raises(UnservableExportError, match="model.onnx: sha256 .* does not match"):
        Predictor(export, "onnx")


@pytest.mark.parametrize("key, value", [
    ("precisions", ["fp32"]), ("precisions", {"paddle": "fp32"}), ("backends", ["paddle"]),
    ("precision_measured", {"paddle": ["fp32"]})])
@pytest.mark.parametrize("backend", ["paddle", "auto"])
def test_a_manifest_with_a_misshapen_map_is_refused_naming_the_key(cls_export, tmp_path,  # noqa: F811
                                                                   key, value, backend):
    """manifest.json is not in its own hash list: a hand-edited one is refused by name, not
    a traceback from the first loader that reads it as a map."""
    bad = tmp_path / "export"
    shutil.copytree(cls_export[0], bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest[key] = value
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UnservableExportError, match=f"manifest.json: key '{key}' must"):
        Predictor(str(bad), backend, precision="auto")


@pytest.mark.parametrize("backend,precision", [("paddle", "bf16"), ("onnx", "fp16")])
def test_low_precision_close_to_fp32(cls_export, backend, precision):  # noqa: F811
    fp32 = Predictor(cls_export[0], backend).predict(MIXED)
    low = Predictor(cls_export[0], backend, precision=precision).predict(MIXED)
    diff = max(abs(a["probs"][k] - b["probs"][k]) for a, b in zip(fp32, low) for k in a["probs"])
    assert diff < 0.02, diff


def test_unavailable_backend_or_precision(cls_export, tag_export):  # noqa: F811
    # the export has bf16 on the other backend: the refusal says which, and how to ask for it
    with pytest.raises(ValueError, match="not available for backend 'onnx'; this export has bf16 "
                                         "for backend 'paddle': ask for backend 'paddle' "
                                         r"with precision 'bf16' \(--backend paddle "
                                         r"--precision bf16\)"):
        Predictor(cls_export[0], "onnx", precision="bf16")
    with pytest.raises(ValueError, match=r"not available for backend 'onnx'; choose one of"):
        Predictor(tag_export[0], "onnx", precision="bf16")  # exported fp32 only
    with pytest.raises(UnservableExportError, match="'fp16' was not exported"):
        Predictor(tag_export[0], "onnx", precision="fp16")
    with pytest.raises(ValueError, match="fp16 has no CPU kernels"):
        Predictor(cls_export[0], "paddle", precision="fp16")
    with pytest.raises(ValueError, match="unknown backend"):
        Predictor(cls_export[0], "tensorflow")
    with pytest.raises(ValueError, match="TensorRT runs only with"):
        Predictor(cls_export[0], "onnx", tensorrt=True)
    import paddle

    if not paddle.device.is_compiled_with_cuda():  # this CPU build: a clear refusal
        with pytest.raises(ValueError, match="no CUDA"):
            Predictor(cls_export[0], "paddle", device="gpu")


def test_clones_run_in_parallel_threads(cls_export):  # noqa: F811
    p = Predictor(cls_export[0], "paddle")
    expected = p.predict(MIXED)
    results, errors = {}, []

    def work(k, pred):
        try:
            for _ in range(5):
                results[k] = pred.predict(MIXED)
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k, p.clone())) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
        assert not t.is_alive(), "a predictor thread is still running after 300 s"
    assert not errors
    assert all(r == expected for r in results.values())


def test_a_clone_on_one_thread_answers_bit_for_bit_like_its_two_thread_original(
        cls_export, tag_export):  # noqa: F811
    """Deploy.split_threads_under_load runs a text on a 2-thread or a 1-thread ONNX Runtime
    session, whichever is free: the two give the same bits, so an answer never depends on
    the load it arrived in.  Paddle's predictors keep one thread count (not offered)."""
    for export_dir in (cls_export[0], tag_export[0]):
        wide = Predictor(export_dir, "onnx", threads=2)
        narrow = wide.clone(threads=1)
        assert wide.can_change_threads() and (wide.threads, narrow.threads) == (2, 1)
        assert (wide.engine.settings["intra_op_threads"],
                narrow.engine.settings["intra_op_threads"]) == (2, 1)
        assert narrow.clone().engine._session is narrow.engine._session  # a clone shares it
        for texts in (MIXED, MIXED[:1], MIXED * 3):
            for a, b in zip(wide.predict(texts), narrow.predict(texts)):
                assert a.keys() == b.keys()
                for key in a:
                    assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key
    assert not Predictor(cls_export[0], "paddle", threads=2).can_change_threads()
