"""YAML configs: sections by concern, ``_base_`` inheritance, ``-o`` overrides, schema validation.

A config is read once at an entry point (``load_config``) and handed down as a
``Config``: nested sections with attribute access (``cfg.Data.max_len``).  Every
key is declared in ``ppvarlen/config_schema.py``; anything else is an error that
names the key path, the file and the closest valid key.

The Model section is per model: ``MODEL_KEYS`` (config_schema.py) lists the keys each
``Model.name`` reads, and a key the chosen model does not read is an error naming the
model and the keys it accepts.  Inheritance rule: a layer (a ``_base_`` file's child, or
the ``-o`` overrides together) whose ``Model.name`` differs from the model of the layers
below it starts a fresh Model section -- the other model's keys are not inherited.  Keys
the model does not read are not stored (so a saved config loads again); reading one
(``cfg.Model.beam_size`` for a classifier) gives its schema default.
"""
import copy
import difflib
import os

import yaml

from .config_field import Field
from .config_schema import MODEL_KEYS, SCHEMA
from .utils.io import atomic_write_text


class ConfigError(ValueError):
    """A config problem the user can fix; the message names file, key and fix."""


class Config:
    """Attribute access over a validated nested dict (``cfg.Train.amp.dtype``).

    ``defaults``, nested like ``data``: values read for keys ``data`` does not hold
    (the Model keys the chosen model does not use); never stored, saved or listed.
    """

    def __init__(self, data, defaults=None):
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_defaults", defaults or {})

    def __getattr__(self, key):
        data = object.__getattribute__(self, "_data")
        defaults = object.__getattribute__(self, "_defaults")
        if key in data:
            v = data[key]
            if isinstance(v, dict):
                below = defaults.get(key)
                return Config(v, below if isinstance(below, dict) else None)
            return v
        if key in defaults:
            return copy.deepcopy(defaults[key])
        raise AttributeError(f"config has no key {key!r}; keys here: {sorted(data)}")

    def __setattr__(self, key, value):
        raise AttributeError("Config is read-only; use -o overrides or apply_overrides()")

    def __getitem__(self, key):
        return self.__getattr__(key)

    def __contains__(self, key):
        return key in self._data

    def get(self, key, default=None):
        return self.__getattr__(key) if key in self._data or key in self._defaults else default

    def to_dict(self):
        return copy.deepcopy(self._data)

    def __repr__(self):
        return f"Config({self._data!r})"


# ---------------------------------------------------------------- reading

def _read_yaml(path):
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not valid UTF-8 ({e}); save the config as UTF-8") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        raise ConfigError(f"{where}: invalid YAML: {getattr(e, 'problem', e)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections (Global:, Data:, ...), "
                          f"got {type(data).__name__}")
    return data


def _deep_merge(base, over):
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _load_with_bases(path, _seen=()):
    path = os.path.abspath(path)
    if path in _seen:
        raise ConfigError(f"{path}: _base_ inheritance loops back to itself via {list(_seen)}")
    data = _read_yaml(path)
    bases = data.pop("_base_", None)
    if bases is None:
        return data
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{path}: _base_ must be a path or a list of paths, got {bases!r}")
    merged = {}
    for b in bases:
        bpath = b if os.path.isabs(b) else os.path.join(os.path.dirname(path), b)
        merged = _merge_layer(merged, _load_with_bases(bpath, _seen + (path,)))
    return _merge_layer(merged, data)


def _model_name(data):
    section = data.get("Model")
    return section.get("name") if isinstance(section, dict) else None


def _switches_model(base, new_name):
    """True when ``new_name`` names another model than the Model section of ``base``."""
    section = base.get("Model")
    if new_name is None or not isinstance(section, dict) or not section:
        return False
    return new_name != section.get("name", SCHEMA["Model"]["name"].default)


def _merge_layer(base, layer):
    """``layer`` over ``base``; a layer naming another model drops the base's Model keys."""
    if _switches_model(base, _model_name(layer)):
        base = dict(base, Model={})
    return _deep_merge(base, layer)


# ---------------------------------------------------------------- overrides

def parse_override(text):
    """``"Data.buckets=[64,128]"`` -> (["Data", "buckets"], [64, 128]).

    The value is parsed as YAML, so lists, bools, null, numbers and strings work;
    a value that is not valid YAML is taken as a plain string.
    """
    if "=" not in text:
        raise ConfigError(f"bad override {text!r}: expected KEY=VALUE, e.g. -o Train.epochs=3 "
                          f"or -o Data.buckets=[64,128,256]")
    key, raw = text.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if not key or any(not p or not p.replace("_", "").isalnum() for p in parts):
        raise ConfigError(f"bad override {text!r}: key {key!r} must be dotted names like "
                          f"Section.key or Train.amp.dtype")
    if len(parts) < 2:
        raise ConfigError(f"bad override {text!r}: give the section too, e.g. Train.{key}=...")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        if raw.strip()[:1] in "[{":
            raise ConfigError(f"bad override {text!r}: value {raw!r} looks like a list/mapping "
                              f"but is not valid YAML (e.g. [64,128] or {{a: 1}})") from None
        value = raw
    return parts, value


def apply_overrides(data, overrides):
    """Apply ``-o`` texts to ``data`` in place: one layer, so an override naming another model
    first drops the Model keys of the config's model (see the module docstring)."""
    parsed = [parse_override(text) for text in overrides or []]
    names = [value for parts, value in parsed if parts == ["Model", "name"]]
    if names and _switches_model(data, names[-1]):
        data["Model"] = {}
    for parts, value in parsed:
        node = data
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = value
    return data


# ---------------------------------------------------------------- validation

def _suggest(key, options):
    m = difflib.get_close_matches(key, options, n=1, cutoff=0.5)
    if not m:
        lower = {o.lower(): o for o in options}
        if key.lower() in lower:
            m = [lower[key.lower()]]
    return f"; did you mean {m[0]!r}?" if m else f"; valid keys: {', '.join(sorted(options))}"


def _check_value(field, value, where):
    if value is None:
        if field.nullable:
            return None
        raise ConfigError(f"{where}: null is not allowed; expected {field.type_name()}")
    t = field.type
    if t == "any":
        out = value
    elif t is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        out = value
    elif t is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r} ({type(value).__name__})")
        out = value
    elif t is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if isinstance(value, str):
            try:
                value = float(value)  # YAML 1.1 reads "1e-3" as a string
            except ValueError:
                raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        if not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r} ({type(value).__name__})")
        out = float(value)
    elif t == "int or auto":
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int)
                                or value < 1):
            raise ConfigError(f"{where}: expected a count >= 1 or auto, got {value!r}")
        out = value
    elif t is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r} ({type(value).__name__})")
        out = value
    elif isinstance(t, tuple) and t[0] == "list":
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list of {t[1].__name__}, got {value!r}; "
                              f"write it as [a, b, c]")
        out = [_check_value(Field(t[1]), v, f"{where}[{i}]") for i, v in enumerate(value)]
    elif t is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        out = value
    else:  # pragma: no cover - schema bug
        raise TypeError(f"unknown schema type {t!r} at {where}")
    if field.choices is not None:
        items = out if isinstance(out, list) else [out]
        for item in items:
            if item not in field.choices:
                raise ConfigError(f"{where}: {item!r} is not one of {list(field.choices)}"
                                  f"{_suggest(str(item), [str(c) for c in field.choices])}")
    return out


def _validate_section(schema, data, path, source):
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {path or 'top level'} must be a mapping, got {data!r}")
    out = {}
    for key, value in data.items():
        kpath = f"{path}.{key}" if path else str(key)
        if key not in schema:
            raise ConfigError(f"{source}: unknown key {kpath!r}{_suggest(str(key), list(schema))}")
        spec = schema[key]
        if isinstance(spec, dict):
            out[key] = _validate_section(spec, value if value is not None else {}, kpath, source)
        else:
            out[key] = _check_value(spec, value, f"{source}: {kpath}")
    for key, spec in schema.items():
        if key in out:
            continue
        kpath = f"{path}.{key}" if path else key
        if isinstance(spec, dict):
            out[key] = _validate_section(spec, {}, kpath, source)
        elif spec.required:
            raise ConfigError(f"{source}: missing required key {kpath!r} ({spec.help or spec.type_name()})")
        else:
            out[key] = copy.deepcopy(spec.default)
    return out


def _model_section(model, given, source):
    """The validated Model section reduced to the keys its model reads (``given``: the keys
    the config set); a given key the model does not read is an error."""
    name = model["name"]
    accepted = MODEL_KEYS[name]
    unused = [k for k in given if k != "name" and k not in accepted]
    if unused:
        notes = []
        for key in unused:
            owners = [m for m, keys in MODEL_KEYS.items() if key in keys]
            hint = difflib.get_close_matches(key, accepted, n=1)
            notes.append(f"Model.{key} (a key of {', '.join(owners)}"
                         f"{f'; did you mean {hint[0]!r}?' if hint else ''})")
        raise ConfigError(
            f"{source}: Model.name={name} does not use {', '.join(notes)}; {name} accepts "
            f"{', '.join(sorted(accepted))}. Remove the key or choose the model it belongs to "
            f"(a _base_ child or -o that changes Model.name starts a fresh Model section, so "
            f"the other model's keys are not inherited)")
    return {k: v for k, v in model.items() if k == "name" or k in accepted}


def validate(data, source="<config>"):
    out = _validate_section(SCHEMA, data, "", source)
    given = data.get("Model") or {}
    out["Model"] = _model_section(out["Model"], given, source)
    return out


def _unused_model_defaults(name):
    """Schema defaults of the Model keys model ``name`` does not read."""
    return {k: copy.deepcopy(f.default) for k, f in SCHEMA["Model"].items()
            if k != "name" and k not in MODEL_KEYS[name]}


def load_config(path=None, overrides=None, data=None):
    """Read ``path`` (following ``_base_``), apply ``-o`` overrides, validate, return Config."""
    source = path or "<dict>"
    raw = _load_with_bases(path) if path else copy.deepcopy(dict(data or {}))
    if overrides:
        source = f"{source} (with -o {' '.join(overrides)})"
        raw = apply_overrides(raw, overrides)
    resolved = validate(raw, source)
    return Config(resolved, {"Model": _unused_model_defaults(resolved["Model"]["name"])})


def _absolute_paths(data, schema=SCHEMA):
    """A copy of ``data`` whose path keys (``Field.path``) are absolute: relative paths are
    relative to where the run started, and a resolved config is read from anywhere."""
    out = {}
    for key, value in data.items():
        field = schema.get(key) if isinstance(schema, dict) else None
        if isinstance(value, dict) and isinstance(field, dict):
            value = _absolute_paths(value, field)
        elif getattr(field, "path", False) and isinstance(value, str):
            value = os.path.abspath(value)
        out[key] = value
    return out


def save_config(cfg, path):
    """Write a resolved config: every key, path keys made absolute."""
    data = _absolute_paths(cfg.to_dict() if isinstance(cfg, Config) else cfg)
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def add_config_args(parser):
    parser.add_argument("-c", "--config", required=True, help="YAML config file")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. -o Train.epochs=3 -o Data.buckets=[64,128] "
                             "(repeatable)")
    return parser
