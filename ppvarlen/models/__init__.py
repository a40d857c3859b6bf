"""``build_model(model_cfg, vocab_size, num_labels, pad_id, task)``: the registered family's
builder (ppvarlen/model_registry.py) with the keys it declares.

Every model: ``forward(self, input_ids, seq_len, labels=None)`` with masks
built inside from ``seq_len`` (see docs/DESIGN.md "Models").  Model modules are
imported when chosen, so building a GRU tagger does not import PaddleNLP.
"""
import copy
import importlib

from ..config import Config, ConfigError
from ..config_schema import SCHEMA
from ..model_registry import MODELS
from ..utils.log import get_logger


# Tasks that train the encoder of another task's model: task -> (models with that encoder,
# the task they are built for, module and class of the layer wrapped around them).
ENCODER_TASKS = {"masked_lm": (("transformer_cls",), "classification", "masked_lm", "MaskedLM")}


def _check_task(name, task):
    """The task ``name`` is built for when it serves ``task`` (ConfigError otherwise)."""
    if task in ENCODER_TASKS:
        names, built_for = ENCODER_TASKS[task][:2]
        if name not in names:
            raise ConfigError(f"Model.name={name}: the {task} task trains the encoder of "
                              f"{', '.join(names)} (its encode()); set Model.name: {names[0]}")
        return built_for
    if not MODELS[name].serves(task):
        raise ConfigError(f"Model.name={name} is a {' / '.join(MODELS[name].tasks)} model but the "
                          f"data task is {task!r}; pick a {task} model ("
                          f"{', '.join(n for n, m in MODELS.items() if m.serves(task))})")
    return task


def _resolve(model_cfg):
    """The keys the chosen model reads (its registration): schema defaults + the given values,
    as a plain dict, so a builder cannot read a key its model does not declare.

    A Config was checked at load time (a key the model does not use is an error there);
    a plain dict may also carry other models' keys (tests share one size dict), which
    are left out here.  Unknown keys are an error either way.
    """
    given = model_cfg.to_dict() if isinstance(model_cfg, Config) else dict(model_cfg or {})
    unknown = sorted(set(given) - set(SCHEMA["Model"]))
    if unknown:
        raise ConfigError(f"Model: unknown key(s) {unknown}; valid keys: {sorted(SCHEMA['Model'])}")
    name = given.get("name", SCHEMA["Model"]["name"].default)
    if name not in MODELS:
        raise ConfigError(f"Model.name={name!r} is not one of {sorted(MODELS)}")
    keys = ("name",) + MODELS[name].keys
    resolved = {k: copy.deepcopy(SCHEMA["Model"][k].default) for k in keys}
    resolved.update((k, v) for k, v in given.items() if k in keys)
    return resolved


def build_model(model_cfg, vocab_size, num_labels, pad_id, task, init_weights=True):
    """Build the ``Model.name`` model for ``task`` with the given vocabulary and label count.

    ``Model.init_from`` (warm start) is loaded when ``init_weights``; code that
    loads a full checkpoint right after passes False, so the pretraining file
    need not exist on an export or serving host.
    """
    cfg = _resolve(model_cfg)
    name = cfg["name"]
    if task in ENCODER_TASKS:  # e.g. masked-LM: the classifier inside an MLM head
        module, layer = ENCODER_TASKS[task][2:]
        inner = build_model(model_cfg, vocab_size, num_labels, pad_id, _check_task(name, task),
                            init_weights)
        return getattr(importlib.import_module(f"ppvarlen.models.{module}"), layer)(inner)
    _check_task(name, task)
    family = MODELS[name]
    if vocab_size < 1 or num_labels < family.min_labels:
        raise ValueError(f"build_model: vocab_size={vocab_size} and num_labels={num_labels} must be >= 1")
    model = builder_of(family)(cfg, vocab_size, num_labels, pad_id, init_weights)
    if cfg.get("init_from") and init_weights:
        _warm_start(model, cfg["init_from"])
    return model


def _warm_start(model, path):
    from .weights import load_matching_weights  # paddle: `import ppvarlen.models` stays paddle-free

    report = load_matching_weights(model, path, key="Model.init_from")
    log = get_logger("ppvarlen.models")
    log.info("Model.init_from=%s: loaded %d tensors; kept the fresh init of %d: %s; ignored %d in the "
             "file: %s", path, len(report["loaded"]), len(report["missing"]), report["missing"],
             len(report["unexpected"]), report["unexpected"])


def builder_of(family):
    """The function a registration names ("module:function"), imported when first used."""
    module, _, function = family.builder.partition(":")
    return getattr(importlib.import_module(module), function)
