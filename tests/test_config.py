"""Config system: overrides, inheritance, validation errors that name the place."""
import os
import textwrap

import pytest
import yaml

from ppvarlen.config import ConfigError, load_config, parse_override, save_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(p)


def test_defaults_and_public_keys():
    cfg = load_config(data={})
    for section, key in [("Global", "output_dir"), ("Global", "seed"), ("Data", "max_len"),
                         ("Train", "epochs"), ("Train", "max_steps")]:
        assert key in cfg[section]


@pytest.mark.parametrize("text,expected", [
    ("Data.buckets=[64,128,256]", (["Data", "buckets"], [64, 128, 256])),
    ("Train.amp.enable=true", (["Train", "amp", "enable"], True)),
    ("Data.max_size=null", (["Data", "max_size"], None)),
    ("Global.output_dir=out/x y", (["Global", "output_dir"], "out/x y")),
    ("Optimizer.lr=3e-4", (["Optimizer", "lr"], "3e-4")),  # YAML 1.1 string, coerced later
    ("Train.epochs=5", (["Train", "epochs"], 5)),
])
def test_parse_override(text, expected):
    assert parse_override(text) == expected


def test_overrides_nested_lists_and_coercion():
    cfg = load_config(data={}, overrides=["Data.buckets=[64,128]", "Train.amp.dtype=float16",
                                          "Optimizer.lr=3e-4", "Data.max_size=null"])
    assert cfg.Data.buckets == [64, 128]
    assert cfg.Train.amp.dtype == "float16"
    assert cfg.Optimizer.lr == pytest.approx(3e-4)
    assert cfg.Data.max_size is None


@pytest.mark.parametrize("override,needle", [
    ("Train.epochs", "expected KEY=VALUE"),
    ("=3", "must be dotted names"),
    ("epochs=3", "give the section too"),
    ("Train..epochs=3", "must be dotted names"),
    ("Data.buckets=[64,128", "not valid YAML"),
])
def test_bad_override_syntax(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(data={}, overrides=[override])
    assert needle in str(e.value) and override in str(e.value)


def test_unknown_key_names_file_path_and_suggestion(tmp_path):
    path = write(tmp_path, "c.yaml", """
        Data:
          max_lne: 128
        """)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert path in msg and "Data.max_lne" in msg and "did you mean 'max_len'" in msg


def test_unknown_section_and_nested_key(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'Trian'.*did you mean 'Train'"):
        load_config(data={"Trian": {}})
    with pytest.raises(ConfigError, match=r"Train.amp.dtyp.*did you mean 'dtype'"):
        load_config(data={}, overrides=["Train.amp.dtyp=float16"])


@pytest.mark.parametrize("data,needle", [
    ({"Data": {"max_len": "long"}}, "Data.max_len: expected an integer"),
    ({"Data": {"max_len": True}}, "Data.max_len: expected an integer"),
    ({"Train": {"amp": {"enable": "yes please"}}}, "Train.amp.enable: expected true/false"),
    ({"Data": {"buckets": 64}}, "Data.buckets: expected a list of int"),
    ({"Data": {"buckets": [64, "x"]}}, "Data.buckets[1]: expected an integer"),
    ({"Data": {"sampler": "tokenbudget"}}, "did you mean 'token_budget'"),
    ({"Data": {"max_len": None}}, "Data.max_len: null is not allowed"),
    ({"Data": 3}, "Data must be a mapping"),
])
def test_type_errors_name_key_and_type(data, needle):
    with pytest.raises(ConfigError) as e:
        load_config(data=data)
    assert needle in str(e.value)


def test_override_error_mentions_override():
    with pytest.raises(ConfigError, match=r"-o Data.max_len=abc.*Data.max_len: expected an integer"):
        load_config(data={}, overrides=["Data.max_len=abc"])


def test_base_inheritance_and_override_order(tmp_path):
    write(tmp_path, "base.yaml", """
        Data: {max_len: 128, buckets: [32, 64]}
        Train: {epochs: 2, amp: {enable: true}}
        """)
    child = write(tmp_path, "child.yaml", """
        _base_: base.yaml
        Train: {epochs: 5}
        """)
    cfg = load_config(child, overrides=["Data.max_len=256"])
    assert cfg.Data.max_len == 256 and cfg.Data.buckets == [32, 64]
    assert cfg.Train.epochs == 5 and cfg.Train.amp.enable is True


def test_base_loop_is_an_error(tmp_path):
    a = write(tmp_path, "a.yaml", "_base_: b.yaml\n")
    write(tmp_path, "b.yaml", "_base_: a.yaml\n")
    with pytest.raises(ConfigError, match="loops back"):
        load_config(a)


def test_yaml_syntax_error_names_line(tmp_path):
    path = write(tmp_path, "bad.yaml", "Data:\n  max_len: [1, 2\nTrain: {}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert f"{path}:" in str(e.value) and "invalid YAML" in str(e.value)


def test_non_utf8_and_missing_file(tmp_path):
    p = tmp_path / "latin1.yaml"
    p.write_bytes("Global: {output_dir: caf\xe9}\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_config(str(p))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(str(tmp_path / "nope.yaml"))


def test_config_is_read_only_and_round_trips(tmp_path):
    cfg = load_config(data={"Data": {"max_len": 64}})
    with pytest.raises(AttributeError):
        cfg.Data.max_len = 3
    out = tmp_path / "resolved.yaml"
    save_config(cfg, str(out))
    again = load_config(str(out))
    assert again.to_dict() == cfg.to_dict()


def test_every_shipped_config_loads_and_opens_with_its_command():
    found = []
    for root, _, files in os.walk(os.path.join(REPO, "configs")):
        for f in files:
            if f.endswith(".yaml"):
                path = os.path.join(root, f)
                found.append(path)
                load_config(path)
                first = open(path, encoding="utf-8").readline()
                rel = os.path.relpath(path, REPO)
                assert first.startswith("#") and rel in first, \
                    f"{rel} must open with a comment giving the command that runs it"
    assert found, "no configs shipped"
    with open(found[0], encoding="utf-8") as f:
        assert isinstance(yaml.safe_load(f), dict)
