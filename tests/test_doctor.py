"""ppvarlen-doctor on models with one planted variable-length bug each, and on correct ones.

Each planted model (tests/doctor_models.py, random init, built here) is flagged by exactly the
check that should flag it, with the measured evidence: a PaddleNLP ERNIE directory whose
config.json pad_token_id is not the tokenizer's pad id (PaddleNLP then masks nothing), a mean
pooling that divides by the padded length (PIR, legacy .pdmodel and ONNX), a sequence length
frozen at export (PIR [None, 32], ONNX [1, 32]), a -1e9 additive mask (fp16), NaN on a row
without tokens, a BERT tokenizer with more tokens than the embedding.  A ppvarlen export and an
unmodified PaddleNLP directory pass every applicable check.  The command's exit codes (0, 1,
2), its JSON report and its refusals (missing files, pickle-only weights) are checked too.
"""
import json
import os

import numpy as np
import pytest

import doctor_models as planted
from ppvarlen.cli import main_doctor
from ppvarlen.runtime import admission
from ppvarlen.runtime import row_checks
from ppvarlen.doctor import output_checks, tokenizer_check
from ppvarlen.doctor.diagnose import diagnose
from test_deploy_helpers import make_tiny_export

LONG_TEXT = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过" * 3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{name: MODEL path} of every planted and correct model."""
    base = str(tmp_path_factory.mktemp("doctor"))
    prefixes = {name: planted.save_program(name, base) for name in planted.PROGRAMS}
    onnx = planted.to_onnx([prefixes[n] for n in ("mean_over_padding", "fixed_1x32", "minus_1e9",
                                                   "oddly_named")])
    paths = {f"{name}.json": prefix + ".json" for name, prefix in prefixes.items()}
    paths.update({os.path.basename(os.path.dirname(p)) + ".onnx": p for p in onnx})
    paths["mean_over_padding.pdmodel"] = planted.save_legacy("mean_over_padding",
                                                             os.path.join(base, "legacy"))
    paths["ernie"] = planted.save_paddlenlp_dir(os.path.join(base, "ernie"))
    paths["ernie_pad_id"] = planted.save_paddlenlp_dir(os.path.join(base, "ernie_pad_id"),
                                                       pad_token_id=1)
    paths["bert_big_vocab"] = planted.save_paddlenlp_dir(os.path.join(base, "bert"), "bert",
                                                         extra_tokens=30)
    paths["export"] = make_tiny_export(os.path.join(base, "export"))[0]
    return paths


@pytest.fixture(scope="module")
def reports(models):
    """{name: (LoadedModel, {check number: CheckResult})} of each model, without --texts."""
    out = {}
    for name, path in models.items():
        model, results = diagnose(path)
        out[name] = model, {r.number: r for r in results}
    return out


def failing(reports, name):
    return {n for n, r in reports[name][1].items() if r.status == "fail"}


def result(reports, name, number):
    return reports[name][1][number]


# ---------------------------------------------------------------- correct models pass

@pytest.mark.parametrize("name", ["export", "ernie"])
def test_correct_models_pass_every_applicable_check(reports, name):
    checks = reports[name][1]
    assert failing(reports, name) == set(), {n: r.summary for n, r in checks.items()}
    assert {n for n, r in checks.items() if r.status == "pass"} >= {1, 2, 3, 4, 6, 7}
    assert checks[8].status == "n/a"  # no --texts


def test_the_export_runs_through_the_serving_predictor_and_its_own_limits(reports):
    model, checks = reports["export"]
    assert isinstance(model.run, admission.PredictorRows)
    assert model.max_position == 16 and model.tokenizer.wraps
    assert "refused before the model" in checks[6].summary  # length 17: validation refuses it
    assert "refused before the model" in checks[4].evidence[
        "a fully padded row (0 tokens) beside a real one"]
    # float32 only (its manifest lists no fp16): the mask scan runs, no cast is tried
    assert checks[5].status == "pass" and "no constant" in checks[5].summary
    assert checks[7].evidence["vocab_size"] == checks[7].evidence["embedding_rows"]


# ---------------------------------------------------------------- each planted bug, its check

def test_padding_ignored_by_a_paddlenlp_directory_is_check_2_with_the_cause(reports):
    assert failing(reports, "ernie_pad_id") == {2}
    check = result(reports, "ernie_pad_id", 2)
    assert check.evidence["max_abs_delta"]["logits"] > 1e-5
    assert check.evidence["differing_runs"] == check.evidence["runs"]
    assert "pad_token_id (1 in config.json)" in check.fix and "pads with 0" in check.fix
    model = reports["ernie_pad_id"][0]
    assert set(model.fed) == {"input_ids", "token_type_ids"}  # what tokenizer(texts) returns
    assert any("no attention_mask is fed" in note for note in model.notes)
    # the same measurement on the unmodified directory is within fp32 noise
    assert result(reports, "ernie", 2).evidence["max_abs_delta"]["logits"] < 1e-6


@pytest.mark.parametrize("name", ["mean_over_padding.json", "mean_over_padding.onnx",
                                  "mean_over_padding.pdmodel"])
def test_mean_pooling_over_padding_is_check_2_in_each_format(reports, name):
    assert failing(reports, name) == {2}
    check = result(reports, name, 2)
    assert max(check.evidence["max_abs_delta"].values()) > 1e-2
    assert check.evidence["extra_pads"] == [1, 8, 32]
    assert result(reports, name, 3).status == "pass"  # same width, other rows: no effect
    assert reports[name][0].fed.keys() == {"input_ids", "seq_len"}


def test_legacy_pdmodel_loads_in_paddle_inference_and_its_program_is_read(reports):
    model = reports["mean_over_padding.pdmodel"][0]
    assert "legacy .pdmodel" in model.kind and model.embedding_rows == planted.VOCAB
    assert [i.shape_text() for i in model.inputs] == ["[?, ?]", "[?]"]


def test_a_sequence_length_frozen_at_export_is_check_1(reports):
    assert failing(reports, "fixed_32.json") == {1}
    check = result(reports, "fixed_32.json", 1)
    assert {(f["axis"], f["size"]) for f in check.evidence["fixed"]} == {("sequence", 32)}
    assert result(reports, "fixed_32.json", 2).status == "n/a"  # padding cannot vary
    assert result(reports, "fixed_32.json", 3).status == "pass"
    assert failing(reports, "fixed_1x32.onnx") == {1}
    fixed = result(reports, "fixed_1x32.onnx", 1).evidence["fixed"]
    assert {(f["axis"], f["size"]) for f in fixed} == {("batch", 1), ("sequence", 32)}
    assert result(reports, "fixed_1x32.onnx", 3).status == "n/a"  # rows run one at a time
    assert result(reports, "fixed_1x32.onnx", 4).status == "pass"


def test_fixed_length_padding_share_is_measured_on_the_users_texts(models, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("的一是\n不了人我在有\n他\n", encoding="utf-8")
    vocab = tmp_path / "tok"
    vocab.mkdir()
    planted.write_vocab(vocab / "vocab.txt")
    _, results = diagnose(models["fixed_32.json"], str(vocab), str(texts))
    checks = {r.number: r for r in results}
    assert {n for n, r in checks.items() if r.status == "fail"} == {1}
    padding = checks[1].evidence["texts"]
    assert padding["count"] == 3 and padding["longer_than_fixed"] == 0
    # [CLS] text [SEP]: 5 + 8 + 3 real positions of 3 x 32
    assert padding["padding_share"] == pytest.approx(1 - 16 / 96, abs=1e-4)
    assert checks[7].status == "pass" and checks[8].status == "pass"


def test_a_minus_1e9_mask_in_float16_is_check_5_with_the_constant_and_the_nan(reports):
    assert failing(reports, "minus_1e9.onnx") == {5}
    check = result(reports, "minus_1e9.onnx", 5)
    assert check.evidence["mask_constants"][0]["value"] == -1e9
    assert "Softmax" in check.evidence["mask_constants"][0]["softmax"]
    assert check.evidence["fp16"]["nonfinite"], check.evidence["fp16"]
    # the Paddle program holds the same constant: found by its scan, no fp16 run on CPU
    assert failing(reports, "minus_1e9.json") == {5}
    paddle_check = result(reports, "minus_1e9.json", 5)
    assert paddle_check.evidence["mask_constants"][0]["op"] == "full"
    assert "no float16 run here" in paddle_check.summary


def test_nan_on_a_row_without_tokens_is_check_4(reports):
    assert failing(reports, "nan_on_empty.json") == {4}
    evidence = result(reports, "nan_on_empty.json", 4).evidence
    assert evidence["a fully padded row (0 tokens) beside a real one"].startswith("non-finite")
    assert evidence["a 1-token text"] == "finite"


def test_a_tokenizer_larger_than_the_embedding_is_check_7(reports):
    assert failing(reports, "bert_big_vocab") == {7}
    check = result(reports, "bert_big_vocab", 7)
    assert check.evidence["vocab_size"] == check.evidence["embedding_rows"] + 30
    assert "48 rows: ids 48..77" in check.summary


def test_inputs_no_rule_maps_are_reported_and_their_checks_not_applicable(reports):
    model, checks = reports["oddly_named.onnx"]
    assert model.unmapped == ["foo", "bar"] and model.run is None
    assert all(checks[n].status == "n/a" for n in (2, 3, 4, 6))
    assert "foo" in checks[2].summary and failing(reports, "oddly_named.onnx") == set()


def test_position_limit_is_probed_past_the_table(reports):
    check = result(reports, "ernie", 6)
    assert check.status == "pass"
    assert check.evidence["max_position_sources"] == {"config.json max_position_embeddings": 64}
    assert check.evidence["at_limit"] == "runs"
    past = check.evidence["past_limit"]
    assert past.startswith("raises") and "< 64" in past


def test_truncation_counts_the_users_long_texts(models, tmp_path):
    texts = tmp_path / "texts.jsonl"
    texts.write_text("\n".join(json.dumps({"text": t}) for t in ["的一是", LONG_TEXT, "他们"])
                     + "\nnot json\n", encoding="utf-8")
    _, results = diagnose(models["ernie"], texts_file=str(texts))
    check = results[7]
    assert check.number == 8 and check.status == "fail"
    assert check.evidence["longer"] == 1 and check.evidence["unreadable_lines"] == 1
    assert check.evidence["max_excess"] == len(LONG_TEXT) + 2 - 64
    assert "Data.long_text: window" in check.fix


# ---------------------------------------------------------------- the command

def test_command_exit_codes_and_json_report(models, tmp_path, capsys):
    assert main_doctor([models["export"]]) == 0
    out = capsys.readouterr().out
    assert "0 of 8 checks failed" in out and "padding invariance" in out
    report = tmp_path / "report.json"
    assert main_doctor([models["minus_1e9.onnx"], "--json", str(report)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "fixes:" in out and "masked_fill_value" in out
    doc = json.loads(report.read_text("utf-8"), parse_constant=pytest.fail)  # strict JSON
    assert doc["failed"] == [5] and doc["exit_code"] == 1
    assert doc["model"]["fed"]["attention_mask"] == "1 on real tokens, 0 on pads"


def test_a_model_that_cannot_be_loaded_is_exit_2_naming_the_file(models, tmp_path, capsys):
    missing = tmp_path / "nothing.onnx"
    assert main_doctor([str(missing)]) == 2
    assert "nothing.onnx: no such file or directory" in capsys.readouterr().err
    program = tmp_path / "lonely" / "model.json"
    program.parent.mkdir()
    program.write_text(open(models["fixed_32.json"], encoding="utf-8").read(), encoding="utf-8")
    assert main_doctor([str(program)]) == 2
    err = capsys.readouterr().err
    assert "model.json: no model.pdiparams beside it" in err and "Traceback" not in err
    not_a_program = tmp_path / "config.json"
    not_a_program.write_text("{}", encoding="utf-8")
    assert main_doctor([str(not_a_program)]) == 2
    assert "not a Paddle PIR program" in capsys.readouterr().err


def test_pickle_only_weights_are_refused_with_the_conversion(models, tmp_path, capsys):
    directory = tmp_path / "pickled"
    directory.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        (directory / name).write_bytes(open(os.path.join(models["ernie"], name), "rb").read())
    (directory / "model_state.pdparams").write_bytes(b"\x80\x04not loaded")
    assert main_doctor([str(directory)]) == 2
    err = capsys.readouterr().err
    assert "only pickle weights (model_state.pdparams)" in err and "save_pretrained" in err


# ---------------------------------------------------------------- one implementation

def test_doctor_and_admission_judge_with_the_same_functions():
    assert admission.nonfinite_rows is row_checks.nonfinite_rows
    assert output_checks.padding_difference is row_checks.padding_difference
    assert output_checks.batch_difference is admission.batch_difference
    assert tokenizer_check.vocabulary_problem is admission.vocabulary_problem


def test_compare_outputs_tolerance_shapes_and_non_finite():
    ref = {"logits": np.array([0.01, 0.02]), "tags": np.array([1, 2, 3])}
    same = row_checks.compare_outputs(ref, {"logits": ref["logits"] + 1e-9, "tags": ref["tags"]},
                                      atol=1e-6)
    assert same["same"] and same["changed_answers"] == []
    moved = row_checks.compare_outputs(ref, {"logits": np.array([0.02, 0.01]), "tags": ref["tags"]},
                                       atol=1e-6)
    assert not moved["same"] and moved["changed_answers"] == ["logits"]
    cut = row_checks.compare_outputs(ref, {"logits": ref["logits"], "tags": np.array([1, 2])})
    assert cut["max_abs_delta"]["tags"] is None and not cut["same"]
    nan = row_checks.compare_outputs(ref, {"logits": np.array([np.nan, 0.0]), "tags": ref["tags"]})
    assert nan["max_abs_delta"]["logits"] == float("inf") and not nan["same"]
    rows = [{"logits": np.array([0.0, np.inf])}, {"logits": np.zeros(2)}]
    assert row_checks.nonfinite_outputs(rows) == {"logits": [0]}
