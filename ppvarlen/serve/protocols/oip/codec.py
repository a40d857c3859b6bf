"""Open Inference Protocol v2 (KServe / Triton, REST and gRPC): tensors in and out of
ppvarlen's results.

The model takes one ``BYTES`` input of shape ``[-1]`` (a batch of UTF-8 texts) per text of the
task's request item (``Task.oip_inputs``: ``text``; ``text_a`` and ``text_b`` for text pairs;
``question`` and ``context`` for extractive QA, the way Triton ensembles take several text
inputs) and answers with one output per field of the task's ``/predict`` prediction, one row per text
(``outputs``): typed tensors where the protocol has a type (a ``{label: probability}`` map is
an ``FP32`` ``[-1, C]`` tensor), JSON strings in ``BYTES`` where it has none (tags, entities).  Both JSON
tensor data and Triton's binary tensor data extension (``Inference-Header-Content-Length``:
the JSON header, then each binary tensor in order; ``BYTES`` elements as a 4-byte
little-endian length and the bytes) are read and written.  Refusals are ``errors.ServeError``
types; ``routes`` renders them as the protocol's ``{"error": "..."}``, ``grpc`` as status
codes.  ``model_config`` is the Triton model configuration the
``model_configuration`` extension serves (what ``perf_analyzer`` reads before it sends load).
"""
import functools
import json
import struct
import typing
import weakref

import numpy as np

from ppvarlen.runtime.admission import strict_json
from ppvarlen.tasks import get_task

from ppvarlen.serve.errors import InvalidInput, MalformedRequest, shown
from ppvarlen.serve.http.edge import header_int

HEADER_LENGTH = "Inference-Header-Content-Length"
HEADER_LENGTH_KEY = HEADER_LENGTH.lower().encode()  # as ASGI headers name it
EXTENSIONS = ["binary_tensor_data", "parameters", "model_configuration", "statistics"]


def extensions(repository):
    """The extensions served: ``model_repository`` only with a repository (its routes)."""
    return EXTENSIONS + (["model_repository"] if repository else [])
TRITON_TYPES = {"BYTES": "TYPE_STRING", "FP32": "TYPE_FP32", "INT64": "TYPE_INT64",
                "BOOL": "TYPE_BOOL"}
# Parameters are free-form key/values in the protocol (a string, number or boolean each); the
# ones with a meaning here are read where they are used (long_text, binary_data_output and
# timeout of the request, binary_data_size of an input, binary_data of an output), every other
# key is accepted and ignored (docs/SERVING.md lists those clients are known to send).
NUMPY = {"FP32": "<f4", "INT64": "<i8", "BOOL": "?"}
MAX_ID_CHARS = 256
_served_outputs = weakref.WeakKeyDictionary()  # served model -> its output tensors


def _json_text(value):
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _tensor_of(name, annotation, label_names):
    """(datatype, shape after the batch dim, result -> value) of one prediction field."""
    origin = typing.get_origin(annotation)
    if origin is dict:  # {label: probability}: a row of C floats in the labels' order
        return "FP32", [len(label_names)], lambda r: [r[name][n] for n in label_names]
    if origin is list:  # tags, entities, ids: JSON text, the protocol has no nested type
        return "BYTES", [], lambda r: _json_text(r[name])
    if annotation is bool:
        return "BOOL", [], lambda r: r[name]
    if annotation is int:
        return "INT64", [], lambda r: r[name]
    if annotation is float:
        return "FP32", [], lambda r: r[name]
    if annotation is str or origin is typing.Literal:
        return "BYTES", [], lambda r: r[name]
    return "BYTES", [], lambda r: _json_text(r[name])


def _shaped(name, tail):
    """A list of floats whose width the task gives (``Task.output_shapes``): FP32, as it is."""
    return "FP32", list(tail), lambda r: r[name]


@functools.lru_cache(maxsize=64)
def _outputs(task_name, label_names, shaped):
    prediction = get_task(task_name).prediction_model(list(label_names))
    shapes = dict(shaped)
    return [(name, *(_shaped(name, shapes[name]) if name in shapes else
                     _tensor_of(name, field.annotation, label_names)))
            for name, field in prediction.model_fields.items()]


def outputs(task_name, label_names, shapes=None):
    """[(name, datatype, shape after the batch dim, result -> value)]: one tensor per field
    of the task's /predict prediction, so both answer the same values under the same names;
    ``shapes``: the widths the task gives of some fields (``Task.output_shapes``)."""
    shaped = tuple((n, tuple(tail)) for n, tail in sorted((shapes or {}).items()))
    return _outputs(task_name, tuple(label_names), shaped)


def outputs_of(model):
    """``outputs`` of a served version (read by every infer request: looked up once)."""
    specs = _served_outputs.get(model)
    if specs is None:
        specs = _served_outputs[model] = outputs(
            model.task_name, model.label_names, model.task.output_shapes(model.manifest))
    return specs


# model metadata's platform: a name from the protocol's list ("Platforms": onnx_onnxv1 is an ONNX
# model for ONNX Runtime); the list has no Paddle format, so a Paddle Inference model gets a
# name of the list's "<project>_<format>" form rather than a listed name that would be false
PLATFORMS = {"onnx": "onnx_onnxv1", "paddle": "paddle_inference"}


def model_metadata(name, versions, model):
    return {"name": name, "versions": list(versions), "platform": PLATFORMS[model.backend],
            "inputs": [{"name": n, "datatype": "BYTES", "shape": [-1]}
                       for n in model.task.oip_inputs],
            "outputs": [{"name": n, "datatype": d, "shape": [-1] + tail}
                        for n, d, tail, _ in outputs_of(model)]}


def model_config(model):
    """The Triton model configuration of a served version (JSON field names of Triton's
    ``model_config.proto``; the gRPC service parses the same document into the message).
    ``max_batch_size`` 0: each input tensor carries the batch itself, ``[-1]`` texts; the
    dynamic batcher is ppvarlen's length-aware one, its settings in ``parameters``."""
    deploy = model.settings
    params = {"batcher": "ppvarlen length-aware: texts sorted by length, split into the "
                         "cheapest token-budget groups (padding + a fixed cost per forward pass)",
              "max_batch_tokens": deploy.max_batch_tokens,
              "max_texts_per_batch": deploy.max_batch_size,
              "batch_overhead_tokens": model.overhead_tokens,
              "batch_when_all_queued": deploy.batch_when_all_queued,
              "long_text": model.long_text, "task": model.task_name,
              "precision": model.precision_choice["precision"],
              "precision_requested": model.precision_choice["requested"],
              "precision_reason": model.precision_choice["reason"],
              "math_threads": model.threads, "math_threads_reason": model.threads_reason,
              "math_threads_under_load": "{batches_at_once} batches at once, {threads_each} "
                                         "thread each".format(**model.under_load)
                                         if model.under_load else "not split"}
    return {"name": model.name, "platform": f"ppvarlen_{model.backend}", "backend": "ppvarlen",
            "version_policy": {"latest": {"num_versions": 1}},
            "max_batch_size": 0,
            "input": [{"name": n, "data_type": "TYPE_STRING", "dims": [-1]}
                      for n in model.task.oip_inputs],
            "output": [{"name": n, "data_type": TRITON_TYPES[d], "dims": [-1] + tail}
                       for n, d, tail, _ in outputs_of(model)],
            "dynamic_batching": {"max_queue_delay_microseconds": int(deploy.max_wait_ms * 1000),
                                 "preserve_ordering": True,
                                 "default_queue_policy": {"max_queue_size": deploy.queue_size}},
            "instance_group": [{"name": model.name, "kind": "KIND_CPU",
                                "count": deploy.workers}],
            "parameters": {k: {"string_value": str(v)} for k, v in params.items()}}


def long_text_choices(model):
    """Policies a request may ask for: refuse or cut a long text; windows only where the
    export was made for them (its manifest holds their stride)."""
    return ["error", "truncate"] + (["window"] if model.long_text == "window" else [])


# ---------------------------------------------------------------- requests

def _fail(message, refused_texts=0):
    raise InvalidInput(message, refused_texts=refused_texts)


def _object(value, where, allowed):
    """``value`` if it is an object whose fields are all in the set ``allowed``."""
    if not isinstance(value, dict):
        _fail(f"{where} must be a JSON object, got {type(value).__name__}")
    if not value.keys() <= allowed:
        unknown = sorted(set(value) - allowed)
        _fail(f"{where}: unknown field(s) {shown(unknown)}; allowed: {sorted(allowed)}")
    return value


def _parameters(value, where):
    """A ``parameters`` object: free-form keys, each a string, number or boolean (the
    protocol's $parameter); the keys are the caller's to interpret."""
    if not isinstance(value, dict):
        _fail(f"{where} must be a JSON object of key/values, got {type(value).__name__}")
    for key, v in value.items():
        if not isinstance(v, (str, int, float, bool)):
            _fail(f"{where}.{shown(key)[1:-1]} is {shown(v, 32)}; a parameter's value is "
                  f"a string, a number or a boolean")
    return value


def _flat_texts(data, n, where):
    """A BYTES tensor's ``data`` of shape [N] or [N, 1]: flat, or nested one text a row as
    the protocol allows ("their natural multi-dimensional representation")."""
    if not isinstance(data, list):
        _fail(f"{where}.data must be a list of strings (or use the binary extension)")
    if data and all(isinstance(row, list) and len(row) == 1 for row in data):
        data = [row[0] for row in data]
    if len(data) != n:
        _fail(f"{where}.shape says {n} texts but data has {len(data)}")
    for i, t in enumerate(data):
        if not isinstance(t, str):
            _fail(f"{where}.data[{i}] must be a string, got {type(t).__name__}")
    return data


def _texts_shape(shape, where):
    """N of a BYTES input's shape: [N] or [N, 1] (a batch of strings as many clients shape
    it), N >= 1."""
    if (not isinstance(shape, list) or len(shape) not in (1, 2) or not all(map(_is_integer, shape))
            or shape[0] < 1 or (len(shape) == 2 and shape[1] != 1)):
        _fail(f"{where}.shape {shown(shape)}: must be [N] or [N, 1], N >= 1 texts")
    return int(shape[0])


def check_addressed(payload, model):
    """A body's ``model_name`` / ``model_version`` (KServe's client sends them): accepted when
    they name the model and version the path chose, refused otherwise."""
    named = payload.get("model_name", model.name)
    if named != model.name:
        _fail(f"model_name {shown(named)} in the body differs from the path's model "
              f"{shown(model.name)}; leave it out or make them agree")
    version = payload.get("model_version", model.version)
    if not isinstance(version, str) or version not in ("", model.version):
        _fail(f"model_version {shown(version)} in the body differs from the version that "
              f"answers, {model.version!r} (the path's, or the newest ready one); leave it out "
              f"or make them agree")


def _is_integer(value):
    """JSON's integers: 3 and 3.0 alike (JSON Schema counts both), never true/false."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def split_body(body, header_length):
    """(JSON bytes, binary bytes) of a request (binary extension: header length given)."""
    if header_length is None:
        return body, b""
    n = header_int(header_length, HEADER_LENGTH)
    if n > len(body):
        raise MalformedRequest(f"bad {HEADER_LENGTH} header {n}: the JSON part's length in "
                               f"bytes, at most the body's {len(body)}", HEADER_LENGTH)
    return body[:n], body[n:]


def decode_bytes_tensor(raw, count, where):
    """``count`` elements of the binary BYTES format -> list of str."""
    texts, pos = [], 0
    for i in range(count):
        if pos + 4 > len(raw):
            _fail(f"{where}: binary data ends before element {i} of {count}")
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            _fail(f"{where}: element {i} says {n} bytes but the binary data ends first")
        try:
            texts.append(raw[pos:pos + n].decode("utf-8"))
        except UnicodeDecodeError:
            _fail(f"{where}[{i}] is not valid UTF-8")
        pos += n
    if pos != len(raw):
        _fail(f"{where}: {len(raw) - pos} bytes of binary data after the {count} elements")
    return texts


def parse_infer(payload, binary, limits, model):
    """The infer request -> (request items, id, parameters, [(output name, binary?)]).

    One ``BYTES`` tensor of shape [N] per name of ``Task.oip_inputs``, in any order, the same
    N each; row i of them is request item i (``Task.oip_item``).  Binary tensors
    (``binary_data_size``) take their bytes from ``binary`` in the order the inputs are
    listed, as the extension says."""
    _object(payload, "body", {"id", "parameters", "inputs", "outputs", "model_name",
                              "model_version"})
    check_addressed(payload, model)
    request_id = payload.get("id")
    if "id" in payload and not isinstance(request_id, str):
        _fail(f"id must be a string, got {type(request_id).__name__}")
    if request_id is not None and len(request_id) > MAX_ID_CHARS:
        _fail(f"id has {len(request_id)} characters; at most {MAX_ID_CHARS} (it is echoed in "
              f"the answer)")
    params = _parameters(payload.get("parameters", {}), "parameters")
    policy = params.get("long_text")
    if "long_text" in params and policy not in long_text_choices(model):
        _fail(f"parameters.long_text {shown(policy)}: one of {long_text_choices(model)}")
    timeout = params.get("timeout", 0)
    if not _is_integer(timeout) or timeout < 0:
        _fail(f"parameters.timeout {shown(timeout)}: microseconds the request may wait in the "
              f"queue (an integer >= 0; 0 = no limit)")
    binary_default = params.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        _fail("parameters.binary_data_output must be true or false")
    names = list(model.task.oip_inputs)
    listed = " and ".join(repr(n) for n in names)
    inputs = payload.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != len(names):
        _fail(f"inputs must be a list of exactly {len(names)} tensor(s), {listed} (BYTES, "
              f"shape [N] or [N, 1])")
    columns, count, used = {}, None, 0
    for k, tensor in enumerate(inputs):
        where = f"inputs[{k}]"
        _object(tensor, where, {"name", "shape", "datatype", "parameters", "data"})
        name = tensor.get("name")
        if name not in names or name in columns:
            _fail(f"{where}.name {shown(name)}: this model's inputs are {listed}, each once")
        if tensor.get("datatype") != "BYTES":
            _fail(f"{where}.datatype {shown(tensor.get('datatype'))}: {name!r} is BYTES (UTF-8 "
                  f"texts)")
        n = _texts_shape(tensor.get("shape"), where)
        if n > limits.max_texts_per_request:
            _fail(f"{n} texts in one request; at most {limits.max_texts_per_request} "
                  f"(Deploy.max_texts_per_request) — split the request")
        if count is not None and n != count:
            _fail(f"{where}.shape [{n}] differs from the other inputs' [{count}]: row i of "
                  f"every input makes request item i")
        count = n
        tparams = _parameters(tensor.get("parameters", {}), f"{where}.parameters")
        if "binary_data_size" in tparams:
            size = tparams["binary_data_size"]
            if not _is_integer(size) or size < 0 or used + size > len(binary):
                _fail(f"{where}.parameters.binary_data_size {shown(size)} does not match the "
                      f"{len(binary) - used} bytes left after the JSON header")
            if "data" in tensor:
                _fail(f"{where} has both data and binary_data_size; send one")
            columns[name] = decode_bytes_tensor(binary[used:used + int(size)], n, where)
            used += int(size)
        else:
            columns[name] = _flat_texts(tensor.get("data"), n, where)
        for i, t in enumerate(columns[name]):
            if len(t) > limits.max_text_chars:
                _fail(f"{where}.data[{i}] has {len(t)} characters; at most "
                      f"{limits.max_text_chars} (Deploy.max_text_chars)", refused_texts=1)
    if used != len(binary):
        _fail(f"{len(binary) - used} bytes of binary data after the JSON header that no "
              f"input's binary_data_size accounts for")
    items = [model.task.oip_item(tuple(columns[n][i] for n in names)) for i in range(count)]
    out_names = [n for n, *_ in outputs_of(model)]
    requested = payload.get("outputs")
    if "outputs" not in payload:
        wanted = [(n, binary_default) for n in out_names]
    else:
        if not isinstance(requested, list) or not requested:
            _fail("outputs must be a non-empty list of {\"name\": ...} (or left out: all)")
        wanted = []
        for k, out in enumerate(requested):
            _object(out, f"outputs[{k}]", {"name", "parameters"})
            if out.get("name") not in out_names:
                _fail(f"outputs[{k}].name {shown(out.get('name'))}: this model's outputs are "
                      f"{out_names}")
            oparams = _parameters(out.get("parameters", {}), f"outputs[{k}].parameters")
            flag = oparams.get("binary_data", binary_default)
            if not isinstance(flag, bool):
                _fail(f"outputs[{k}].parameters.binary_data must be true or false")
            wanted.append((out["name"], flag))
    return items, request_id, params, wanted


# ---------------------------------------------------------------- responses

def _binary(datatype, values):
    if datatype == "BYTES":
        parts = []
        for v in values:
            raw = v.encode("utf-8")
            parts.append(struct.pack("<I", len(raw)) + raw)
        return b"".join(parts)
    return np.asarray(values, dtype=NUMPY[datatype]).tobytes()


def output_tensors(model, names, results):
    """[(name, datatype, shape, flat values)] of the outputs ``names`` (REST and gRPC)."""
    specs = {n: (d, tail, get) for n, d, tail, get in outputs_of(model)}
    out = []
    for name in names:
        datatype, tail, get = specs[name]
        values = [get(r) for r in results]
        flat = [x for v in values for x in v] if tail else values
        out.append((name, datatype, [len(results)] + tail, flat))
    return out


def raw_contents(datatype, values):
    """A tensor's flat values in the binary form (the binary extension's BYTES elements, or
    little-endian numbers): REST's binary outputs and gRPC's ``raw_output_contents``."""
    return _binary(datatype, values)


def infer_response(model, request_id, params, wanted, results):
    """(body bytes, headers: lowercase (name, value) byte pairs) of the infer answer for
    ``results`` (one per text)."""
    tensors = output_tensors(model, [n for n, _ in wanted], results)
    out_json, blobs = [], []
    for (name, datatype, shape, flat), (_, as_binary) in zip(tensors, wanted):
        tensor = {"name": name, "datatype": datatype, "shape": shape}
        if as_binary:
            blob = _binary(datatype, flat)
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            tensor["data"] = flat
        out_json.append(tensor)
    body = {"model_name": model.name, "model_version": model.version, "outputs": out_json}
    if request_id is not None:
        body["id"] = request_id
    if params.get("long_text"):
        body["parameters"] = {"long_text": params["long_text"]}
    header = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
    if not blobs:
        return header, [(b"content-type", b"application/json")]
    return header + b"".join(blobs), [(b"content-type", b"application/octet-stream"),
                                      (HEADER_LENGTH_KEY, b"%d" % len(header))]


class _Rendered:
    """What the OIP renderer reads of a served model, for a predictor not served yet."""

    def __init__(self, predictor):
        self.name, self.version = predictor.manifest.get("model_name") or "model", "0"
        self.task, self.task_name = predictor.task, predictor.task.name
        self.label_names, self.manifest = list(predictor.label_names), predictor.manifest


def render_checks():
    """Admission's render checks for this protocol: the answer to the example as OIP JSON and
    as the binary extension (gRPC sends the binary form), the JSON part parsed back strictly."""
    def render(binary):
        def check(predictor, results):
            served = _Rendered(predictor)
            wanted = [(n, binary) for n, *_ in outputs_of(served)]
            content, headers = infer_response(served, None, {}, wanted, results)
            head = content[:int(dict(headers)[HEADER_LENGTH_KEY])] if binary else content
            strict_json(head, "the OIP infer answer")
        return check

    return [("OIP JSON", render(False)), ("OIP binary", render(True))]
