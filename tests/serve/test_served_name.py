"""``--model-name`` / ``Deploy.model_name``: the name a single export is served under (the OIP
paths, the OpenAI model id, X-Model-Name), instead of the manifest's architecture name."""
import pytest
from fastapi.testclient import TestClient
from export_helpers import cls_export  # noqa: F401

from ppvarlen.cli import main_serve
from ppvarlen.config import ConfigError
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import app_from_config, create_app, deploy_settings


def test_the_export_answers_under_the_chosen_name_only(cls_export):  # noqa: F811
    app = create_app(Predictor(cls_export[0], "onnx"), deploy_settings(model_name="sentiment"))
    with TestClient(app) as http:
        assert http.get("/v2/models/sentiment").json()["name"] == "sentiment"
        assert http.get("/v2/models/tiny").status_code == 404
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["好"]}]}
        r = http.post("/v2/models/sentiment/infer", json=body)
        assert r.status_code == 200 and r.json()["model_name"] == "sentiment"
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["sentiment"]
        assert http.get("/health").json()["model_name"] == "sentiment"


@pytest.mark.parametrize("name", ["with space", "a/b", "", "x" * 129])
def test_a_name_that_is_no_path_segment_is_refused_naming_the_key(cls_export, name):  # noqa: F811
    with pytest.raises(ConfigError, match="Deploy.model_name .*: 1-128 letters"):
        app_from_config(cls_export[0], deploy_settings(model_name=name), backend="onnx")


def test_a_repository_refuses_the_key(tmp_path):
    with pytest.raises(ConfigError, match="repository's models are named by their directories"):
        app_from_config(None, deploy_settings(model_name="x"), repository=str(tmp_path))


def test_the_flag_and_an_override_that_disagree_exit_2(cls_export, capsys):  # noqa: F811
    code = main_serve(["--model-dir", cls_export[0], "--model-name", "a",
                       "-o", "Deploy.model_name=b"])
    assert code == 2
    assert "--model-name a and -o Deploy.model_name=b disagree" in capsys.readouterr().err
