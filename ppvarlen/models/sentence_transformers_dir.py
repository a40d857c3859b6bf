"""What a sentence-transformers-style directory says about its pooling and normalisation.

A sentence-transformers model saved over a PaddleNLP encoder directory is the encoder at the
root (config.json, weights, tokenizer) plus one sub-directory per module after it, listed in
``modules.json`` (``[{"idx", "name", "path", "type"}]``, written by
``SentenceTransformer.save``):

* ``1_Pooling/config.json`` (``sentence_transformers.models.Pooling``): the boolean keys
  ``pooling_mode_cls_token``, ``pooling_mode_mean_tokens``, ``pooling_mode_max_tokens``,
  ``pooling_mode_mean_sqrt_len_tokens``, ``pooling_mode_weightedmean_tokens``,
  ``pooling_mode_lasttoken`` (several true = the poolings concatenated), plus
  ``word_embedding_dimension`` and ``include_prompt``; a hand-written file may give
  ``pooling_mode`` (a string that overrides the booleans, as Pooling's constructor does);
  an absent boolean takes the constructor's default (mean on, the others off);
* ``2_Normalize`` (``sentence_transformers.models.Normalize``, no files): L2 normalisation of
  the pooled vector.

``modules.json`` decides which modules run: a Normalize directory it does not list is not
applied (sentence-transformers ignores it too).  Without ``modules.json`` the ``N_Pooling`` /
``N_Normalize`` directories speak for themselves.  A module ppvarlen does not apply (Dense,
LayerNorm, ...) is refused rather than skipped: the vectors would silently differ.

``resolve_pooling`` merges that with what the user asked for (Model.pooling / --pooling,
Model.normalize / --normalize): an explicit choice that contradicts the directory is an
error, never an override.  Paddle-free (the CLI checks flags before loading a model).
"""
import json
import os
import re

from ..config import ConfigError
from ..utils.io import atomic_write_json
from ..utils.log import get_logger

log = get_logger("models")

# the poolings of a PaddleNLP encoder as an embedding model (masks.pool over real tokens)
PADDLENLP_EMBED_POOLINGS = ("cls", "mean", "last")
MODULES_FILE = "modules.json"
ST_PACKAGE = "sentence_transformers.models."
# Pooling's boolean config keys -> ppvarlen's pooling name (None: ppvarlen has no such pooling)
POOLING_MODE_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                     "pooling_mode_max_tokens": "max", "pooling_mode_lasttoken": "last",
                     "pooling_mode_mean_sqrt_len_tokens": None,
                     "pooling_mode_weightedmean_tokens": None}
# Pooling's ``pooling_mode`` string values -> the boolean key it switches on
POOLING_MODE_NAMES = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                      "max": "pooling_mode_max_tokens", "lasttoken": "pooling_mode_lasttoken",
                      "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
                      "weightedmean": "pooling_mode_weightedmean_tokens"}
# the keys besides the modes that do not change the vector ppvarlen computes
POOLING_OTHER_KEYS = ("word_embedding_dimension", "include_prompt", "pooling_mode")
# the module types that are the encoder itself (Transformer; older releases: one per model)
ENCODER_MODULES = ("Transformer", "BERT", "RoBERTa", "XLMRoBERTa", "DistilBERT", "ALBERT",
                   "CamemBERT", "XLNet", "T5")
MODULE_DIR = re.compile(r"^\d+_([A-Za-z]\w*)$")


class DirectoryPooling:
    """``pooling`` (ppvarlen name or None) and ``normalize`` (bool or None: not said) with
    ``where`` {"pooling"/"normalize": "file: key"} naming what said it."""

    def __init__(self, pooling=None, normalize=None, where=None):
        self.pooling, self.normalize, self.where = pooling, normalize, dict(where or {})


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not readable JSON ({e})") from None


def _module_list(directory):
    """[(type's class name, path)] from modules.json, or None without one."""
    path = os.path.join(directory, MODULES_FILE)
    if not os.path.isfile(path):
        return None
    entries = _read_json(path)
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "type" in e
                                                for e in entries):
        raise ConfigError(f"{path}: expected a list of {{\"idx\", \"name\", \"path\", \"type\"}} "
                          f"objects (what SentenceTransformer.save writes)")
    entries = sorted(entries, key=lambda e: int(e.get("idx", 0)))
    return [(str(e["type"]).rsplit(".", 1)[-1], str(e.get("path", ""))) for e in entries]


def _module_dirs(directory):
    """[(class name, path)] of the ``N_Name`` sub-directories, in index order."""
    found = []
    for name in os.listdir(directory):
        match = MODULE_DIR.match(name)
        if match and os.path.isdir(os.path.join(directory, name)):
            found.append((int(name.split("_", 1)[0]), match.group(1), name))
    return [(kind, name) for _, kind, name in sorted(found)]


def read_directory_pooling(directory, hidden_size=None):
    """The ``DirectoryPooling`` a directory states (both None for a plain PaddleNLP directory).
    ConfigError for a module or pooling mode ppvarlen cannot apply, naming file and key."""
    modules = _module_list(directory)
    listed = modules is not None
    listing = os.path.join(directory, MODULES_FILE) if listed else directory
    said = DirectoryPooling()
    for kind, path in modules if listed else _module_dirs(directory):
        where = f"{listing}: module {kind} ({path or 'the root'})"
        if kind in ENCODER_MODULES:
            if path not in ("", "."):
                raise ConfigError(f"{where}: the encoder is in {os.path.join(directory, path)}; "
                                  f"ppvarlen loads it from the directory root (config.json, "
                                  f"model.safetensors and the tokenizer files there)")
        elif kind == "Pooling":
            said.pooling, said.where["pooling"] = _read_pooling_config(
                os.path.join(directory, path, "config.json"), hidden_size)
        elif kind == "Normalize":
            said.normalize, said.where["normalize"] = True, where
        else:
            raise ConfigError(f"{where}: ppvarlen applies only the encoder at the directory root, "
                              f"Pooling and Normalize; a {kind} module would be skipped and the "
                              f"vectors would differ from sentence-transformers'. Remove the "
                              f"module (and its modules.json entry) only if the model is meant "
                              f"to be used without it")
    if listed and said.normalize is None:  # modules.json lists every module that runs
        said.normalize, said.where["normalize"] = False, f"{listing}: no Normalize module"
    return said


def _read_pooling_config(path, hidden_size):
    """(ppvarlen pooling, "path: key") from a Pooling module's config.json."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: missing; the Pooling module's config.json says its "
                          f"pooling_mode_* keys")
    cfg = _read_json(path)
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a JSON object of pooling_mode_* keys")
    unknown = sorted(set(cfg) - set(POOLING_MODE_KEYS) - set(POOLING_OTHER_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; ppvarlen reads "
                          f"{sorted(POOLING_MODE_KEYS) + list(POOLING_OTHER_KEYS)}")
    not_bool = [k for k in POOLING_MODE_KEYS if k in cfg and not isinstance(cfg[k], bool)]
    if not_bool:
        raise ConfigError(f"{path}: {not_bool[0]}={cfg[not_bool[0]]!r}: the pooling_mode_* keys "
                          f"are true or false")
    dim = cfg.get("word_embedding_dimension")
    if hidden_size is not None and dim is not None and int(dim) != int(hidden_size):
        raise ConfigError(f"{path}: word_embedding_dimension={dim} but the encoder's "
                          f"config.json has hidden_size={hidden_size}; the Pooling module "
                          f"belongs to another model")
    if cfg.get("pooling_mode") is not None:
        mode = str(cfg["pooling_mode"]).lower()
        if mode not in POOLING_MODE_NAMES:
            raise ConfigError(f"{path}: pooling_mode={cfg['pooling_mode']!r} is not a "
                              f"sentence-transformers pooling ({sorted(POOLING_MODE_NAMES)})")
        on = [POOLING_MODE_NAMES[mode]]
        key = f"pooling_mode={mode!r}"
    else:
        # absent booleans take Pooling's constructor defaults: mean on, the others off
        on = [k for k in POOLING_MODE_KEYS
              if cfg.get(k, k == "pooling_mode_mean_tokens") is True]
        key = " + ".join(f"{k}: true" for k in on)
    if not on:
        raise ConfigError(f"{path}: every pooling_mode_* key is false; set one of "
                          f"pooling_mode_cls_token, pooling_mode_mean_tokens, "
                          f"pooling_mode_lasttoken to true")
    if len(on) > 1:
        raise ConfigError(f"{path}: {key}: sentence-transformers concatenates several poolings; "
                          f"ppvarlen pools one way (cls, mean or last): keep one key true")
    return POOLING_MODE_KEYS[on[0]], f"{path}: {key}"


def resolve_pooling(directory, pooling, normalize, supported=PADDLENLP_EMBED_POOLINGS,
                    hidden_size=None, pooling_key="Model.pooling",
                    normalize_key="Model.normalize", default_normalize=False, log_choice=True):
    """(pooling, normalize) for the encoder in ``directory``: the user's ``pooling`` /
    ``normalize`` (None = not given) merged with what the directory states.  ConfigError when
    they disagree, when a pooling is not in ``supported`` or when nobody says the pooling;
    the choice and where it came from are logged (``log_choice``)."""
    if pooling is not None and pooling not in supported:
        raise ConfigError(f"{pooling_key}={pooling}: a PaddleNLP encoder is pooled with "
                          f"{' | '.join(supported)}")
    said = read_directory_pooling(directory, hidden_size)
    if said.pooling is not None and said.pooling not in supported:
        raise ConfigError(f"{said.where['pooling']}: {said.pooling} pooling is not supported "
                          f"by ppvarlen's embedding models (only {', '.join(supported)})")
    if said.pooling is None and said.where.get("pooling"):
        raise ConfigError(f"{said.where['pooling']}: this pooling is not supported by ppvarlen "
                          f"(only {', '.join(supported)})")
    for key, asked, stated in ((pooling_key, pooling, said.pooling),
                               (normalize_key, normalize, said.normalize)):
        if asked is not None and stated is not None and asked != stated:
            what = "pooling" if key == pooling_key else "normalize"
            raise ConfigError(f"{key}={_show(asked)} contradicts the directory: "
                              f"{said.where[what]} (= {_show(stated)}); drop {key} to use the "
                              f"directory's, or fix the directory")
    if pooling is None and said.pooling is None:
        raise ConfigError(f"{directory}: the directory does not say how to pool (no "
                          f"{MODULES_FILE} with a Pooling module, no 1_Pooling/config.json); "
                          f"give {pooling_key} ({' | '.join(supported)})")
    chosen_pooling = said.pooling if pooling is None else pooling
    if normalize is not None:
        chosen_normalize, normalize_from = bool(normalize), normalize_key
    elif said.normalize is not None:
        chosen_normalize, normalize_from = said.normalize, said.where["normalize"]
    else:
        chosen_normalize, normalize_from = bool(default_normalize), "the default"
    if log_choice:
        log.info("embedding of %s: %s pooling (from %s), normalize=%s (from %s)", directory,
                 chosen_pooling, pooling_key if pooling is not None else said.where["pooling"],
                 chosen_normalize, normalize_from)
    return chosen_pooling, chosen_normalize


def write_pooling_modules(directory, pooling, normalize, dim):
    """modules.json + 1_Pooling/config.json (+ 2_Normalize/) stating ``pooling`` and
    ``normalize`` over the encoder at ``directory``'s root, as SentenceTransformer.save lays
    them out; ``read_directory_pooling`` reads back the same two values."""
    modes = {key: name == pooling for key, name in POOLING_MODE_KEYS.items()}
    if not any(modes.values()):
        raise ValueError(f"write_pooling_modules: no sentence-transformers key for {pooling!r}")
    modules = [{"idx": 0, "name": "0", "path": "", "type": ST_PACKAGE + "Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": ST_PACKAGE + "Pooling"}]
    os.makedirs(os.path.join(directory, "1_Pooling"), exist_ok=True)
    atomic_write_json(os.path.join(directory, "1_Pooling", "config.json"),
                      {"word_embedding_dimension": int(dim), **modes, "include_prompt": True})
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": ST_PACKAGE + "Normalize"})
        os.makedirs(os.path.join(directory, "2_Normalize"), exist_ok=True)
    atomic_write_json(os.path.join(directory, MODULES_FILE), modules)
    return directory


def _show(value):
    return str(value).lower() if isinstance(value, bool) else str(value)
