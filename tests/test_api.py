"""The HTTP API describes itself: OpenAPI request/response/error schemas per task, checked by an
API fuzzer (schemathesis) against a running server of each task's export."""
import os
import re
import subprocess
import sys

import httpx
import numpy as np
import pytest
from test_deploy_helpers import NER_TAGS, cls_export, reference, tag_export  # noqa: F401
from test_deploy_seq2seq import make_seq2seq_export
from test_deploy_seq2seq import reference as s2s_reference
from test_server import RunningServer

from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings
from ppvarlen.utils.inputs import is_blank

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "deploy", "schemathesis.toml")


@pytest.fixture(scope="module")
def s2s_error_export(tmp_path_factory):
    """A seq2seq export whose long-text policy is 'error': texts over 16 characters get 422."""
    return make_seq2seq_export(str(tmp_path_factory.mktemp("s2s_err") / "export"), "error")


@pytest.fixture(params=["classification", "tagging", "seq2seq"])
def export(request, cls_export, tag_export, s2s_error_export):  # noqa: F811
    """(task, (export dir, the eager model it was exported from, its encoder))."""
    return request.param, {"classification": cls_export, "tagging": tag_export,
                           "seq2seq": s2s_error_export}[request.param]


@pytest.fixture
def export_dir(export):
    return export[1][0]


def eager_answer(task, model, encoder, text, max_len):
    """What the answer to ``text`` must hold, from the eager model run on it alone (no server,
    no exported graph): classification label and probabilities (softmax written out here),
    tagging tags, seq2seq output ids."""
    if task == "seq2seq":
        return {"output_ids": [int(i) for i in s2s_reference(model, encoder, [text])[0]]}
    out = reference(model, encoder, task, [text], max_len)[0]
    if task == "tagging":
        return {"tags": [NER_TAGS[int(t)] for t in out]}
    probs = np.exp(out - out.max()) / np.exp(out - out.max()).sum()
    names = ["negative", "positive"]
    return {"label": names[int(probs.argmax())], "label_id": int(probs.argmax()),
            "probs": dict(zip(names, probs.tolist()))}


def test_openapi_declares_body_responses_and_a_real_example(export):
    task, (export_dir, model, encoder) = export
    predictor = Predictor(export_dir, "onnx")
    limits = dict(max_texts_per_request=7, max_text_chars=300)
    with RunningServer(create_app(predictor, deploy=deploy_settings(**limits, max_wait_ms=1))) as srv:
        doc = httpx.get(srv.url + "/openapi.json").json()
        post = doc["paths"]["/predict"]["post"]
        assert set(post["responses"]) == {"200", "400", "413", "422", "500", "503"}
        schemas = doc["components"]["schemas"]
        texts = schemas["PredictRequest"]["properties"]["texts"]
        assert texts["maxItems"] == 7 and texts["minItems"] == 1
        # under the 'error' policy a text may not be longer than the export takes
        limit = 16 if predictor.long_text == "error" else 300
        assert texts["items"]["maxLength"] == limit
        example = post["requestBody"]["content"]["application/json"]["example"]
        answer = post["responses"]["200"]["content"]["application/json"]["example"]
        # the /docs example is what the server really answers to it, and that is what the
        # eager model computes for each example text
        assert httpx.post(srv.url + "/predict", json=example).json() == answer
        assert len(answer["predictions"]) == len(example["texts"]) >= 1
        for text, got in zip(example["texts"], answer["predictions"]):
            want = eager_answer(task, model, encoder, text, predictor.max_len)
            assert {k: got[k] for k in want if k != "probs"} == {
                k: v for k, v in want.items() if k != "probs"}, text
            if "probs" in want:
                assert got["probs"] == pytest.approx(want["probs"], abs=1e-4)
        prediction = schemas["PredictResponse"]["properties"]["predictions"]["items"]["$ref"]
        fields = set(schemas[prediction.rsplit("/", 1)[1]]["properties"])
        assert fields == set(answer["predictions"][0])
        for status in ("400", "413", "422", "503"):
            ref = post["responses"][status]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorBody")


def test_blank_means_the_same_in_python_and_json_schema():
    # \x1f and \x85 are whitespace to Python's str/re but not to ECMA regexes; \ufeff the reverse
    for text in [" ", "\t\n", "\x1f", "\x85", "\ufeff", "\u3000 \xa0"]:
        assert is_blank(text), repr(text)
    for text in ["a", " 好 ", "\x00", "\u200b"]:
        assert not is_blank(text), repr(text)


def schemathesis_run(export_dir, cwd):
    """`schemathesis run --checks all` (positive and negative requests, response schemas,
    status codes, headers) against a server of ``export_dir`` -> the finished process."""
    exe = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    with RunningServer(create_app(Predictor(export_dir, "onnx"), deploy=deploy_settings(max_wait_ms=1))) as srv:
        return subprocess.run([exe, "--config-file", CONFIG, "run", srv.url + "/openapi.json",
                               "--checks", "all", "--max-examples", "40", "--seed", "1",
                               "--no-color"], capture_output=True, text=True, timeout=300,
                              cwd=cwd)  # it keeps a cache directory in its cwd


def assert_every_case_passed(r):
    """Every generated case passed.  Warnings are allowed: with two input tensors (pairs, QA)
    most generated infer bodies repeat a name or differ in N, which the schema cannot forbid
    and the server refuses with 422 (deploy/schemathesis.toml counts that as right)."""
    assert r.returncode == 0 and re.search(r"(\d+) generated, \1 passed", r.stdout), \
        r.stdout[-4000:]


def test_schemathesis_finds_no_failure(export_dir, tmp_path):
    """The fuzzer against the server of each task's export."""
    r = schemathesis_run(export_dir, tmp_path)
    assert r.returncode == 0 and "No issues found" in r.stdout, r.stdout[-4000:]
