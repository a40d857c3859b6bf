"""MODEL -> ``LoadedModel``, loaded the way it is deployed.

* a ppvarlen export directory (``manifest.json``): the serving ``Predictor`` (its hashes
  checked), Paddle Inference or ONNX Runtime;
* a PaddleNLP ``save_pretrained`` directory (``config.json`` + ``model.safetensors``): the
  dygraph model, called with what its tokenizer returns (PaddleNLP tokenizers return no
  attention mask: the model then masks ``input_ids == pad_token_id``).  Pickle-only weights
  (``model_state.pdparams``) are refused, with the conversion command
  (``ppvarlen.models.paddlenlp_auto``);
* a Paddle inference program, PIR ``.json`` or legacy ``.pdmodel`` (Paddle 3.3.1's Paddle
  Inference still runs both), with its ``.pdiparams``: Paddle Inference on CPU;
* an ONNX file: ONNX Runtime on CPU.

Anything that stops a model loading is a ``ModelLoadError`` naming the file and what is
missing.  The tokenizer is ``--tokenizer DIR``, else the model's own (an export's, a PaddleNLP
directory's, or one saved beside a graph file); ``config.json`` beside it gives the position
table.
"""
import glob
import os

import onnxruntime as ort
import paddle.inference as paddle_inference

from ppvarlen.config import ConfigError
from ppvarlen.data.errors import DataError
from ppvarlen.runtime.manifest import UnservableExportError, load_manifest
from ppvarlen.runtime.predictor import Predictor
from ppvarlen.runtime.row_checks import ModelRaised, first_line
from ppvarlen.models.paddlenlp_auto import check_pretrained_dir, load_auto_model

from . import fp16, onnx_graph, paddle_graph
from .errors import ModelLoadError
from .feeding import Feeder, map_inputs
from .graph import GraphInput
from .model import LoadedModel, seeded
from .runners import ExportRows, RowRunner, dygraph_batch, onnx_batch, paddle_batch
from .tokenizers import from_encoder, load_tokenizer, read_model_config

EXPORT, PADDLENLP, PIR, LEGACY, ONNX = ("ppvarlen export", "PaddleNLP directory",
                                        "Paddle inference model (PIR .json)",
                                        "Paddle inference model (legacy .pdmodel)", "ONNX file")
ORT_FATAL_ONLY = 4  # onnxruntime's logger severities: 0 verbose ... 3 error, 4 fatal
# config.json architectures suffix -> the PaddleNLP Auto class that loads the head
HEADS = (("ForSequenceClassification", "AutoModelForSequenceClassification"),
         ("ForTokenClassification", "AutoModelForTokenClassification"),
         ("ForQuestionAnswering", "AutoModelForQuestionAnswering"))
WHAT_MODEL_IS = ("a ppvarlen export directory (manifest.json), a PaddleNLP save_pretrained "
                 "directory (config.json + model.safetensors), a Paddle inference model "
                 "(MODEL.json or MODEL.pdmodel + MODEL.pdiparams, or their directory) or an "
                 "ONNX file")


def _program_beside(stem):
    """The Paddle program of ``stem`` (path without extension): PIR first, then legacy."""
    for ext, kind in ((".json", PIR), (".pdmodel", LEGACY)):
        if os.path.isfile(stem + ext):
            return stem + ext, kind
    return None, None


def detect(path):
    """(kind, the file or directory to load) of MODEL; ModelLoadError when it is none of them."""
    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file or directory; MODEL is {WHAT_MODEL_IS}")
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "manifest.json")):
            return EXPORT, path
        if os.path.isfile(os.path.join(path, "config.json")):
            return PADDLENLP, path
        onnx_files = sorted(glob.glob(os.path.join(path, "*.onnx")))
        params = sorted(glob.glob(os.path.join(path, "*.pdiparams")))
        programs = [p for p in (_program_beside(f[:-len(".pdiparams")]) for f in params) if p[0]]
        if len(programs) == 1:
            return programs[0][1], programs[0][0]
        if len(onnx_files) == 1 and not programs:
            return ONNX, onnx_files[0]
        found = [os.path.basename(f) for f in onnx_files + params]
        raise ModelLoadError(f"{path}: " + (f"holds several models ({', '.join(found)}); pass "
                             f"the file to check" if found else
                             f"holds no manifest.json, config.json, *.onnx or *.pdiparams; "
                             f"MODEL is {WHAT_MODEL_IS}"))
    stem, ext = os.path.splitext(path)
    if ext == ".onnx":
        return ONNX, path
    if ext == ".pdmodel":
        return LEGACY, path
    if ext == ".json":
        return PIR, path
    if ext == ".pdiparams":
        program, kind = _program_beside(stem)
        if program:
            return kind, program
        raise ModelLoadError(f"{path}: weights without their program: no {stem}.json or "
                             f"{stem}.pdmodel beside it")
    raise ModelLoadError(f"{path}: not a model file the doctor reads (.onnx, .json, .pdmodel, "
                         f".pdiparams); MODEL is {WHAT_MODEL_IS}")


def load(path, tokenizer_dir=None, backend=None):
    """MODEL -> ``LoadedModel`` (``backend``: an export's, default paddle when it has one)."""
    kind, target = detect(path)
    if kind == EXPORT:
        return load_export(target, backend, tokenizer_dir)
    if kind == PADDLENLP:
        return load_paddlenlp(target, tokenizer_dir)
    if kind == ONNX:
        return load_onnx(target, tokenizer_dir)
    return load_paddle_program(target, kind, tokenizer_dir)


# ---------------------------------------------------------------- a ppvarlen export

def load_export(path, backend, tokenizer_dir):
    try:
        if backend is None:  # the hashes are checked once, by the Predictor below
            backend = "paddle" if "paddle" in load_manifest(path, verify=False)["backends"] \
                else "onnx"
        # at each batch's own shape: the checks vary the padded width on purpose
        predictor = Predictor(path, backend, onednn_shape_grid=False)
    except (UnservableExportError, ConfigError, DataError) as e:
        raise ModelLoadError(f"{path} cannot be loaded: {e}") from None
    manifest, name = predictor.manifest, predictor.backend
    entry = manifest["backends"][name] if isinstance(manifest["backends"][name], dict) else {}
    default = "paddle/model.json" if name == "paddle" else "onnx/model.onnx"
    graph_file = os.path.join(path, entry.get("model", default))
    runtime = "Paddle Inference" if name == "paddle" else "ONNX Runtime"
    model = LoadedModel(path, EXPORT, f"{runtime} (CPU, the serving Predictor, backend {name})")
    if os.path.isfile(graph_file):  # a seq2seq ONNX export has an encoder and a decoder step
        try:
            model.graph = paddle_graph.read_pir(graph_file) if name == "paddle" else \
                onnx_graph.read_graph(onnx_graph.load_model(graph_file), graph_file)
        except (paddle_graph.ProgramFormatError, OSError, ValueError) as e:
            raise ModelLoadError(f"{graph_file} cannot be read: {first_line(e)}") from None
    model.inputs = model.graph.inputs if model.graph else []
    model.tokenizer = from_encoder(predictor.encoder, predictor.add_special_tokens, path)
    if tokenizer_dir:
        model.notes.append(f"--tokenizer {tokenizer_dir} ignored: an export serves with its "
                           f"own vocabulary")
    model.pad_id = predictor.encoder.pad_id
    specs = predictor.task.input_specs
    roles = {spec["name"]: role for spec, role in zip(specs, ("ids", "lengths"))}
    roles.update({spec["name"]: "segments" for spec in specs[2:]})
    model.set_feeding(roles, [])
    model.fed[specs[0]["name"]] += " (the export's vocabulary, through the Predictor)"
    model.run = ExportRows(predictor)
    model.max_len = int(manifest["max_len"])
    model.long_text = predictor.long_text
    model.add_max_position(manifest.get("max_position"), "manifest max_position")
    if model.graph is not None:
        _read_tables(model, specs[0]["name"])
    _measure_outputs(model)
    if predictor.task.generates:
        model.float32_only = "a seq2seq export serves in float32 only (docs/PITFALLS.md 36)"
    precisions = (manifest.get("precisions") or {}).get("onnx", [])
    if "fp16" in precisions:
        model.fp16 = lambda: (_measured(ExportRows(Predictor(path, "onnx", precision="fp16")),
                                        model),
                              "the export's own fp16 ONNX file (onnx/model_fp16.onnx)", True)
    elif not predictor.task.generates:
        # ppvarlen serves a precision only where the export made and verified it (the
        # manifest's precisions): a float16 cast of this graph is not something it can serve
        model.float32_only = (f"this export serves float32 only (manifest precisions: "
                              f"{manifest.get('precisions') or {'onnx': ['fp32']}}); "
                              f"ppvarlen-export --precision fp32,fp16 builds a float16 file with "
                              f"float16-safe masks, verified against fp32")
    return model


# ---------------------------------------------------------------- a PaddleNLP directory

def load_paddlenlp(path, tokenizer_dir):
    try:
        check_pretrained_dir(path, key="MODEL")
    except ConfigError as e:
        raise ModelLoadError(f"{path} cannot be loaded: {e}") from None
    config = read_model_config(path)
    archs = [str(a) for a in config.get("architectures") or []]
    auto_class = next((auto for suffix, auto in HEADS if any(a.endswith(suffix) for a in archs)),
                      "AutoModel")
    try:
        net = load_auto_model(path, auto_class)
    except (ConfigError, OSError, ValueError, KeyError, RuntimeError) as e:
        raise ModelLoadError(f"{path} cannot be loaded: PaddleNLP's {auto_class} fails on it "
                             f"({first_line(e)})") from None
    net.eval()
    model = LoadedModel(path, PADDLENLP, f"PaddleNLP dygraph ({auto_class}, CPU)")
    model.dygraph, model.config = True, config
    model.tokenizer = _tokenizer(tokenizer_dir, path, required=False, model=model)
    names = model.tokenizer.input_names if model.tokenizer and model.tokenizer.input_names \
        else ["input_ids", "token_type_ids"]
    model.inputs = [GraphInput(n, [None, None], "int64") for n in names]
    model.pad_id = model.tokenizer.pad_id if model.tokenizer else \
        int(config.get("pad_token_id") or 0)
    roles, unmapped, note = map_inputs(model.inputs)
    model.set_feeding(roles, unmapped, note)
    if "mask" not in roles.values():
        model.notes.append(
            f"no attention_mask is fed: the tokenizer returns {names} (as tokenizer(texts) "
            f"does), so the model builds its mask from input_ids == pad_token_id "
            f"({config.get('pad_token_id')} in config.json) while pads hold the tokenizer's "
            f"pad id {model.pad_id}")
    weight = net.get_input_embeddings().weight
    model.embedding_rows, model.embedding_source = int(weight.shape[0]), \
        f"{type(net).__name__}.get_input_embeddings() ({list(weight.shape)})"
    model.add_max_position(config.get("max_position_embeddings"),
                           "config.json max_position_embeddings")
    model.run = RowRunner(Feeder(model.inputs, roles, model.pad_id), dygraph_batch(net))
    _measure_outputs(model)
    return model


# ---------------------------------------------------------------- graph files

def load_paddle_program(program, kind, tokenizer_dir):
    reader = paddle_graph.read_pir if kind == PIR else paddle_graph.read_legacy
    try:
        graph = reader(program)
    except paddle_graph.ProgramFormatError as e:
        raise ModelLoadError(f"{e}; cannot be loaded") from None
    params = os.path.splitext(program)[0] + ".pdiparams"
    if not os.path.isfile(params):
        raise ModelLoadError(f"{program}: no {os.path.basename(params)} beside it (the weights "
                             f"paddle.jit.save writes with the program)")
    try:
        config = paddle_inference.Config(program, params)
        config.disable_gpu()
        config.disable_glog_info()
        predictor = paddle_inference.create_predictor(config)
    except Exception as e:  # noqa: BLE001 - Paddle raises many kinds; its words say why
        raise ModelLoadError(f"{program} cannot be loaded by Paddle Inference 3.3.1: "
                             f"{first_line(e)}") from None
    names = list(predictor.get_input_names())
    declared = {i.name: i for i in graph.inputs}
    graph.inputs = [declared.get(n) or GraphInput(n, None, "int64") for n in names]
    model = LoadedModel(program, kind, "Paddle Inference (CPU)")
    model.graph, model.inputs = graph, graph.inputs
    return _graph_model(model, paddle_batch(predictor), tokenizer_dir)


def load_onnx(path, tokenizer_dir):
    try:
        proto = onnx_graph.load_model(path)
        session = _session(path)
    except Exception as e:  # noqa: BLE001 - onnx / onnxruntime errors name the problem
        raise ModelLoadError(f"{path} cannot be loaded: {type(e).__name__}: "
                             f"{first_line(e)}") from None
    model = LoadedModel(path, ONNX, f"ONNX Runtime {ort.__version__} (CPU)")
    model.graph = onnx_graph.read_graph(proto, path)
    model.inputs = model.graph.inputs
    model.fp16 = lambda: _cast_runner(model, path, proto)
    return _graph_model(model, onnx_batch(session), tokenizer_dir)


def _session(path_or_bytes):
    options = ort.SessionOptions()
    # fatal only: the doctor provokes failures on purpose (a row past the position table makes
    # a Gather fail) and reports what the raised exception says; ONNX Runtime would also log
    # each as a red error line, and warn about every unused initializer of a converted graph
    options.log_severity_level = ORT_FATAL_ONLY
    options.intra_op_num_threads = 1
    return ort.InferenceSession(path_or_bytes, options, providers=["CPUExecutionProvider"])


def _graph_model(model, batch_fn, tokenizer_dir):
    """The feeding, tokenizer, tables and row runner of a graph file's model."""
    here = os.path.dirname(os.path.abspath(model.path))
    model.tokenizer = _tokenizer(tokenizer_dir, here, required=bool(tokenizer_dir), model=model)
    model.config = read_model_config(tokenizer_dir or here)
    model.pad_id = model.tokenizer.pad_id if model.tokenizer else \
        int(model.config.get("pad_token_id") or 0)
    if not model.tokenizer:
        model.notes.append(f"pad id {model.pad_id} assumed (no tokenizer), no [CLS]/[SEP] added")
    roles, unmapped, note = map_inputs(model.inputs)
    model.set_feeding(roles, unmapped, note)
    ids = model.ids_input()
    if ids is not None:
        declared = model.graph.input(ids)
        model.fixed_batch, model.fixed_length = declared.fixed(0), declared.fixed(1)
        _read_tables(model, ids, next((n for n, r in roles.items() if r == "positions"), None))
    model.add_max_position(model.config.get("max_position_embeddings"),
                           "config.json max_position_embeddings")
    if not unmapped:
        model.run = RowRunner(Feeder(model.inputs, roles, model.pad_id, model.fixed_length),
                              batch_fn, model.fixed_batch)
        _measure_outputs(model)
    return model


def _tokenizer(tokenizer_dir, default_dir, required, model):
    directory = tokenizer_dir or default_dir
    has_files = any(os.path.isfile(os.path.join(directory, f))
                    for f in ("vocab.txt", "tokenizer_config.json"))
    if not required and not has_files:
        return None
    tokenizer = load_tokenizer(directory, "--tokenizer" if tokenizer_dir else "tokenizer in")
    if not tokenizer_dir and default_dir != model.path:
        model.notes.append(f"tokenizer: the one saved beside the model ({directory})")
    return tokenizer


def _read_tables(model, ids_name, positions_name=None):
    table = model.graph.word_table(ids_name)
    if table:
        model.embedding_rows, model.embedding_source = table[0], f"embedding table {table[1]}"
    position = model.graph.position_table(ids_name, positions_name)
    if position:
        model.add_max_position(position[0], f"position table {position[1]} in the graph")


def _measure_outputs(model):
    """Which outputs are per token, from two runs; a model that cannot run a short row at all
    cannot be checked."""
    row = model.random_row(seeded(), 3)
    try:
        model.run.find_per_token(row)
    except ModelRaised as e:
        raise ModelLoadError(f"{model.path} loads but fails on a {len(row)}-token row "
                             f"{row}: {e}") from None


def _measured(runner, model):
    """``runner`` (a variant of ``model``'s, same outputs) told ``model``'s per-token outputs."""
    runner.per_token = set(getattr(model.run, "per_token", ()))
    return runner


def _cast_runner(model, onnx_file, proto=None):
    """(row runner, what it is, False: not a variant the model ships) of ``onnx_file`` with
    every float constant cast to float16."""
    half = fp16.plain_cast(proto if proto is not None else onnx_graph.load_model(onnx_file))
    session = _session(half.SerializeToString())
    inputs = onnx_graph.graph_inputs(half)
    roles, unmapped, _ = map_inputs(inputs)
    if unmapped:
        raise ModelLoadError(f"the fp16 copy of {onnx_file} has inputs no rule maps: {unmapped}")
    fixed = next((i for i in inputs if roles.get(i.name) == "ids"))
    runner = RowRunner(Feeder(inputs, roles, model.pad_id, fixed.fixed(1)),
                       onnx_batch(session), fixed.fixed(0))
    return _measured(runner, model), f"{os.path.basename(onnx_file)} cast to float16 (onnxconverter-common, " \
                   f"no clamping of constants)", False
