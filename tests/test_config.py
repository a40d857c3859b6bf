"""Config system: overrides, inheritance, validation errors that name the place."""
import os
import subprocess
import sys
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


# ---------------------------------------------------------------- Model section per model

def test_a_key_the_model_does_not_use_is_an_error_naming_model_key_and_accepted_keys():
    from ppvarlen.config_schema import MODEL_KEYS

    with pytest.raises(ConfigError) as e:
        load_config(data={"Model": {"name": "rnn_cls", "num_heads": 8, "wide_buckets": 16}})
    msg = str(e.value)
    assert "Model.name=rnn_cls does not use Model.num_heads (a key of transformer_cls, transformer_span, seq2seq" in msg
    assert "Model.wide_buckets (a key of transformer_cls; did you mean 'ngram_buckets'?)" in msg
    assert "rnn_cls accepts " + ", ".join(sorted(MODEL_KEYS["rnn_cls"])) in msg
    with pytest.raises(ConfigError, match="Model.name=seq2seq does not use Model.init_from"):
        load_config(data={"Model": {"name": "seq2seq", "init_from": "x.safetensors"}})
    with pytest.raises(ConfigError, match="Model.name=ernie_cls does not use Model.pooling"):
        load_config(data={"Model": {"name": "ernie_cls", "pooling": "mean"}})


def test_unused_key_error_names_the_file_and_the_override(tmp_path):
    path = write(tmp_path, "c.yaml", "Model:\n  name: bigru_crf\n  cell: gru\n")
    with pytest.raises(ConfigError, match=f"{path}: Model.name=bigru_crf does not use Model.cell"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"\(with -o Model.beam_size=4\): Model.name=transformer_cls"):
        load_config(data={}, overrides=["Model.beam_size=4"])


def test_model_keys_cover_the_schema_and_the_registry():
    from ppvarlen.config_schema import MODEL_KEYS, SCHEMA
    from ppvarlen.model_registry import MODELS

    model = SCHEMA["Model"]
    assert set(MODEL_KEYS) == set(model["name"].choices) == set(MODELS)
    used = {k for keys in MODEL_KEYS.values() for k in keys}
    assert used <= set(model) - {"name"}
    assert set(model) - {"name"} <= used, "a Model key no model reads"
    for name, keys in MODEL_KEYS.items():
        assert len(set(keys)) == len(keys), name
        assert keys == MODELS[name].keys  # the schema reads each family's keys from its registration


def test_one_registration_states_a_family_and_the_schema_follows():
    """A family registered with a new key (before the schema is read, in a fresh interpreter):
    the schema offers the name and the key, the loader accepts the key for it and refuses it
    (did you mean) for another family; a key declared twice with another default is refused."""
    code = textwrap.dedent("""
        import pytest
        from ppvarlen import model_registry as r
        from ppvarlen.config_field import Field

        r.register_model("toy_cls", tasks=["classification"], builder="toy.module:build",
                         keys={"hidden_size": r.HIDDEN_SIZE, "toy_width": Field(int, 7)})
        with pytest.raises(ValueError, match="Model.hidden_size is declared with another"):
            r.register_model("toy2", tasks=["tagging"], builder="m:f",
                             keys={"hidden_size": Field(int, 64)})
        from ppvarlen.config import ConfigError, load_config
        from ppvarlen.config_schema import SCHEMA

        assert "toy_cls" in SCHEMA["Model"]["name"].choices
        assert SCHEMA["Model"]["toy_width"].default == 7
        cfg = load_config(data={"Model": {"name": "toy_cls", "toy_width": 9}})
        assert (cfg.Model.toy_width, cfg.Model.hidden_size) == (9, 128)
        with pytest.raises(ConfigError, match="Model.name=rnn_cls does not use Model.toy_width "
                                              "[(]a key of toy_cls[)]"):
            load_config(data={"Model": {"name": "rnn_cls", "toy_width": 9}})
        with pytest.raises(ConfigError, match="did you mean 'toy_width'"):
            load_config(data={"Model": {"name": "toy_cls", "toy_widht": 9}})
        print("OK")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "OK", r.stderr[-2000:]


def test_a_child_config_naming_another_model_starts_a_fresh_model_section(tmp_path):
    write(tmp_path, "base.yaml", """
        Data: {max_len: 100}
        Model: {name: transformer_cls, hidden_size: 64, num_heads: 2, pooling: mean}
        """)
    other = write(tmp_path, "other.yaml", """
        _base_: base.yaml
        Model: {name: rnn_cls, cell: gru}
        """)
    same = write(tmp_path, "same.yaml", """
        _base_: base.yaml
        Model: {name: transformer_cls, num_heads: 4}
        """)
    cfg = load_config(other)
    assert cfg.Data.max_len == 100  # the other sections still inherit
    assert cfg.Model.to_dict()["hidden_size"] == 128 and cfg.Model.pooling is None  # defaults
    assert cfg.Model.cell == "gru"
    cfg = load_config(same)
    assert (cfg.Model.hidden_size, cfg.Model.num_heads, cfg.Model.pooling) == (64, 4, "mean")


def test_an_override_naming_another_model_starts_a_fresh_model_section(tmp_path):
    path = write(tmp_path, "c.yaml", "Model: {name: transformer_cls, hidden_size: 64, num_heads: 2}\n")
    cfg = load_config(path, ["Model.name=rnn_cls", "Model.emb_size=16"])
    assert (cfg.Model.name, cfg.Model.hidden_size, cfg.Model.emb_size) == ("rnn_cls", 128, 16)
    # the -o layer is one layer: the order of its keys does not matter
    cfg = load_config(path, ["Model.emb_size=16", "Model.name=rnn_cls"])
    assert (cfg.Model.name, cfg.Model.emb_size) == ("rnn_cls", 16)
    cfg = load_config(path, ["Model.name=transformer_cls", "Model.num_heads=4"])
    assert (cfg.Model.hidden_size, cfg.Model.num_heads) == (64, 4)  # same model: merged
    with pytest.raises(ConfigError, match="rnn_cls does not use Model.num_heads"):
        load_config(path, ["Model.name=rnn_cls", "Model.num_heads=4"])


def test_unused_keys_read_as_defaults_and_are_not_saved(tmp_path):
    from ppvarlen.config_schema import MODEL_KEYS, SCHEMA

    for name, keys in MODEL_KEYS.items():
        cfg = load_config(data={"Model": {"name": name}})
        assert set(cfg.Model.to_dict()) == {"name", *keys}
        for key in set(SCHEMA["Model"]) - {"name", *keys}:
            assert key not in cfg.Model and getattr(cfg.Model, key) == SCHEMA["Model"][key].default
        out = tmp_path / f"{name}.yaml"
        save_config(cfg, str(out))
        assert set(yaml.safe_load(out.read_text(encoding="utf-8"))["Model"]) == {"name", *keys}
        assert load_config(str(out)).to_dict() == cfg.to_dict()
    assert load_config(data={"Model": {"name": "rnn_cls"}}).Model.get("rdrop_alpha") == 0.0
    with pytest.raises(AttributeError, match="no key 'nope'"):
        load_config(data={}).Model.nope


def test_config_errors_do_not_import_paddle():
    import subprocess
    import sys

    code = ("import sys\nfrom ppvarlen.config import ConfigError, load_config\n"
            "try:\n    load_config(data={'Model': {'name': 'bigru_crf', 'num_heads': 2}})\n"
            "except ConfigError as e:\n    print('ERR', 'num_heads' in str(e))\n"
            "import ppvarlen.models\nprint('PADDLE', 'paddle' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["ERR", "True", "PADDLE", "False"], r.stderr


def test_resolved_config_keeps_data_paths_absolute_so_it_works_from_another_directory(
        tmp_path, monkeypatch):
    """A run started with relative data paths writes a config.yaml that `export --verify` (or
    eval) can use from any directory: path keys are written absolute."""
    import json

    from ppvarlen.data.sources import load_corpus
    from ppvarlen.data.errors import DataError

    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir(), elsewhere.mkdir()
    rows = [{"text": f"文本{i}" * (1 + i % 3), "label": "pos" if i % 2 else "neg"} for i in range(30)]
    (run_dir / "train.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    monkeypatch.chdir(run_dir)
    cfg = load_config(overrides=["Data.corpus=jsonl", "Data.train_file=train.jsonl"])
    save_config(cfg, str(run_dir / "config.yaml"))
    assert cfg.Data.train_file == "train.jsonl"  # the run itself reads what it was given

    monkeypatch.chdir(elsewhere)
    resolved = load_config(str(run_dir / "config.yaml"))
    assert resolved.Data.train_file == str(run_dir / "train.jsonl")
    assert len(load_corpus(resolved.Data).splits["train"]) > 0
    with pytest.raises(DataError, match="cannot open data file"):  # what the relative path did
        load_corpus(cfg.Data)
