"""Text pairs and extractive QA over the Open Inference Protocol: two named BYTES inputs
(``text_a`` / ``text_b``, ``question`` / ``context``: ``Task.oip_inputs``), driven by Triton's
own clients, tritonclient.http (JSON and the binary tensor extension) and tritonclient.grpc;
the answers for mixed-length items (a pair cut to max_len, a context read in several
windows) equal /predict's for the same items, and a request that does not make items is
refused naming the input."""
import json

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from pair_qa_exports import pair_export, qa_export  # noqa: F401
from test_server import RunningServer
from tritonclient.utils import InferenceServerException

from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings
from ppvarlen.tasks import get_task

EXPORTS = {"text_pair": "pair_export", "extractive_qa": "qa_export"}


class Served:
    def __init__(self, task_name, srv, grpc_port, items):
        self.task = get_task(task_name)
        self.url, self.grpc_url, self.items = srv.url, f"127.0.0.1:{grpc_port}", items
        health = httpx.get(srv.url + "/health").json()
        self.name, self.labels = health["model_name"], health["labels"]
        meta = httpx.get(f"{srv.url}/v2/models/{self.name}").json()
        self.datatypes = {o["name"]: o["datatype"] for o in meta["outputs"]}
        self.inputs = meta["inputs"]

    def columns(self, items=None):
        """One column of texts per OIP input: row i of them makes request item i."""
        rows = [texts_of(item, self.task.oip_inputs) for item in (items or self.items)]
        return dict(zip(self.task.oip_inputs, map(list, zip(*rows))))

    def predict(self, items=None):
        r = httpx.post(self.url + "/predict", json={self.task.request_key: items or self.items},
                       timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["predictions"]


def texts_of(item, names):
    """The texts of a request item in ``oip_inputs`` order (a pair's list, a QA object)."""
    return tuple(item[n] for n in names) if isinstance(item, dict) else tuple(item)


@pytest.fixture(scope="module", params=sorted(EXPORTS))
def served(request):
    export_dir, _, items = request.getfixturevalue(EXPORTS[request.param])
    limits = dict(max_texts_per_request=16, max_text_chars=1000)
    app = create_app(Predictor(export_dir, "onnx"),
                     deploy=deploy_settings(workers=2, max_wait_ms=5, **limits), grpc_port=0)
    with RunningServer(app) as srv:
        yield Served(request.param, srv, app.state.grpc.port, items)


def assert_equal_predict(served, as_numpy, predictions):
    """Every output row (``as_numpy(name)``) equals the /predict prediction of its item."""
    for out, datatype in served.datatypes.items():
        arr = as_numpy(out)
        assert arr is not None and arr.shape[0] == len(predictions), (out, arr)
        for i, prediction in enumerate(predictions):
            want, got = prediction[out], arr[i]
            if out == "probs":  # a row in the labels' order
                want = [prediction["probs"][n] for n in served.labels]
            if datatype == "BYTES":
                got = got.decode("utf-8") if isinstance(got, bytes) else got
                got = got if isinstance(want, str) else json.loads(got)
            else:
                got = got.tolist()
            if datatype == "FP32":
                assert np.allclose(got, want, rtol=1e-6, atol=1e-5), (out, i, got, want)
            else:
                assert got == want, (out, i, got, want)


def test_the_items_are_mixed_and_oip_item_rebuilds_them(served):
    predictions = served.predict()
    assert len({len("".join(texts_of(it, served.task.oip_inputs))) for it in served.items}) > 3
    assert any(p["truncated"] or p.get("windows", 1) > 1 for p in predictions)
    for item in served.items:
        assert served.task.oip_item(texts_of(item, served.task.oip_inputs)) == item
    assert served.inputs == [{"name": n, "datatype": "BYTES", "shape": [-1]}
                             for n in served.task.oip_inputs]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_http_equals_predict(served, binary):
    client = thttp.InferenceServerClient(served.url.removeprefix("http://"),
                                         network_timeout=120.0)
    assert client.is_model_ready(served.name)
    meta = client.get_model_metadata(served.name)
    assert [i["name"] for i in meta["inputs"]] == list(served.task.oip_inputs)
    config = client.get_model_config(served.name)
    assert [(i["name"], i["data_type"]) for i in config["input"]] == \
        [(n, "TYPE_STRING") for n in served.task.oip_inputs]
    inputs = []
    for name, texts in served.columns().items():
        tensor = thttp.InferInput(name, [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode("utf-8") for t in texts],
                                            dtype=np.object_), binary_data=binary)
        inputs.append(tensor)
    outputs = None if binary else [thttp.InferRequestedOutput(n, binary_data=False)
                                   for n in served.datatypes]
    result = client.infer(served.name, inputs, outputs=outputs, request_id="r-7")
    assert result.get_response()["id"] == "r-7"
    assert_equal_predict(served, result.as_numpy, served.predict())
    client.close()


def test_tritonclient_grpc_equals_predict(served):
    client = tgrpc.InferenceServerClient(served.grpc_url)
    assert client.is_model_ready(served.name)
    meta = client.get_model_metadata(served.name)
    assert [(i.name, i.datatype, list(i.shape)) for i in meta.inputs] == \
        [(n, "BYTES", [-1]) for n in served.task.oip_inputs]
    inputs = []
    for name, texts in reversed(served.columns().items()):  # inputs are matched by name
        tensor = tgrpc.InferInput(name, [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode("utf-8") for t in texts],
                                            dtype=np.object_))
        inputs.append(tensor)
    result = client.infer(served.name, inputs, request_id="g-7")
    assert result.get_response().id == "g-7"
    assert_equal_predict(served, result.as_numpy, served.predict())
    client.close()


def test_requests_that_make_no_items_are_refused_naming_the_input(served):
    first, second = served.task.oip_inputs
    columns = served.columns(served.items[:2])
    url = f"{served.url}/v2/models/{served.name}/infer"
    grpc_client = tgrpc.InferenceServerClient(served.grpc_url)

    def tensor(name, texts):
        return {"name": name, "datatype": "BYTES", "shape": [len(texts)], "data": texts}

    def refused(inputs, words):
        r = httpx.post(url, json={"inputs": inputs}, timeout=60)
        assert r.status_code == 422 and set(r.json()) == {"error"}, r.text
        assert words in r.json()["error"], r.json()
        grpc_inputs = []
        for t in inputs:
            g = tgrpc.InferInput(t["name"], t["shape"], "BYTES")
            g.set_data_from_numpy(np.array([x.encode() for x in t["data"]], dtype=np.object_))
            grpc_inputs.append(g)
        with pytest.raises(InferenceServerException) as err:
            grpc_client.infer(served.name, grpc_inputs)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT", err.value
        assert words in err.value.message(), err.value.message()

    refused([tensor(first, columns[first])], f"exactly 2 tensor(s), '{first}' and '{second}'")
    refused([tensor(first, columns[first]), tensor(first, columns[second])],
            f"inputs[1].name '{first}'")
    refused([tensor(first, columns[first]), tensor(second, columns[second][:1])],
            "inputs[1].shape [1] differs")
    refused([tensor(first, columns[first]), tensor(second, [columns[second][0], "  "])],
            f"rows[1]: {second} is empty")
    refused([tensor(first, columns[first]), tensor(second, ["好" * 1001, "好"])],
            "inputs[1].data[0] has 1001 characters; at most 1000 (Deploy.max_text_chars)")
    grpc_client.close()
