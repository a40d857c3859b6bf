"""One folder per protocol: its codec, its routes, its errors."""
from ppvarlen.runtime.admission import strict_json
from ppvarlen.serve.openapi import predict_body
from ppvarlen.serve.protocols.oip import codec as oip


def render_checks():
    """Every protocol's answer forms, as admission render checks (``runtime.admission.admit``):
    a model is admitted only if each form can send the answer to its example."""
    def predict(predictor, results):
        strict_json(predict_body(results, "0"), "the /predict answer")

    return [("/predict", predict)] + oip.render_checks()
