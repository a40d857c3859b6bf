"""GET /metrics is Prometheus' text format (parsed here with prometheus_client's own parser);
its counters equal what the test sent, per route and status; the JSON stays at /metrics.json."""
import httpx
from prometheus_client.parser import text_string_to_metric_families
from test_deploy_helpers import TEXTS, cls_export  # noqa: F401
from test_server import RunningServer, run_concurrently

from ppvarlen.runtime.predictor import Predictor
from ppvarlen.serve.server import create_app, deploy_settings

INFER = "/v2/models/{name}/infer"


def samples(text):
    """{(sample name, frozenset(labels)): value} of an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(all_samples, name, **labels):
    return all_samples.get((name, frozenset(labels.items())), 0.0)


def infer_body(texts):
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                        "data": texts}]}


def test_prometheus_counts_equal_what_was_sent(cls_export):  # noqa: F811
    app = create_app(Predictor(cls_export[0], "onnx"), deploy=deploy_settings(workers=2, max_wait_ms=10, **dict(max_text_chars=40)))
    good = [[TEXTS[(k + j) % len(TEXTS)] for j in range(1 + k % 3)] for k in range(9)]
    with RunningServer(app) as srv:
        name = httpx.get(srv.url + "/health").json()["model_name"]

        def predict(texts):
            return httpx.post(srv.url + "/predict", json={"texts": texts}, timeout=60)

        def infer(model, texts):
            return httpx.post(f"{srv.url}/v2/models/{model}/infer", json=infer_body(texts),
                              timeout=60)

        replies = run_concurrently(predict, [(t,) for t in good])
        assert [r.status_code for r in replies] == [200] * len(good)
        # refused: a blank text, a text over Deploy.max_text_chars, a text that is not text
        assert [predict(t).status_code for t in (["好", " "], ["长" * 41], [3])] == [422] * 3
        assert infer(name, TEXTS[:4]).status_code == 200
        assert infer(name, TEXTS[:2]).status_code == 200
        assert infer("nope", TEXTS[:1]).status_code == 404
        assert infer(name, [" "]).status_code == 422
        scrape = httpx.get(srv.url + "/metrics")
        as_json = httpx.get(srv.url + "/metrics.json").json()
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    got = samples(scrape.text)
    requests = "ppvarlen_requests_total"
    assert value(got, requests, route="/predict", status="200") == len(good)
    assert value(got, requests, route="/predict", status="422") == 3
    assert value(got, requests, route=INFER, status="200") == 2
    assert value(got, requests, route=INFER, status="404") == 1
    assert value(got, requests, route=INFER, status="422") == 1
    assert value(got, requests, route="/health", status="200") == 1
    assert value(got, "ppvarlen_request_duration_seconds_count", route="/predict") == len(good) + 3
    served = sum(len(t) for t in good) + 4 + 2
    assert value(got, "ppvarlen_texts_total", outcome="served") == served
    assert value(got, "ppvarlen_texts_total", outcome="refused") == 3  # blank x2, too long x1
    assert value(got, "ppvarlen_texts_total", outcome="truncated") == 0
    model = {"model": name, "version": "1"}
    # every served text ran in exactly one batch and waited in the queue once
    assert value(got, "ppvarlen_batch_size_sum", **model) == served
    assert value(got, "ppvarlen_queue_wait_seconds_count", **model) == served
    batches = value(got, "ppvarlen_batch_size_count", **model)
    assert 1 <= batches <= served and batches == as_json["batches"]
    assert value(got, "ppvarlen_real_tokens_total", **model) == as_json["real_tokens"]
    assert value(got, "ppvarlen_padded_tokens_total", **model) == as_json["padded_tokens"]
    assert 0 < value(got, "ppvarlen_padding_efficiency", **model) <= 1
    assert value(got, "ppvarlen_queue_depth") == 0
    assert value(got, "ppvarlen_model_version_loaded", **model) == 1
    assert value(got, "process_resident_memory_bytes") > 0
    assert as_json["responses"]["200"] == len(good) + 2
