"""The rooms of ppvarlen/serve: transports (http/, grpc/) and the models' side (repository, data
plane, batcher) know no protocol; a protocol (protocols/NAME/) knows no other protocol.  Read
from the source (every import, also one inside a function), so a violation fails here before
it is ever run."""
import os

from test_hygiene import imported_modules

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVE = os.path.join(REPO, "ppvarlen", "serve")
PROTOCOLS = "ppvarlen.serve.protocols"
# the modules that must import no protocol (prefixes of dotted module names)
PROTOCOL_FREE = ("ppvarlen.serve.http", "ppvarlen.serve.grpc", "ppvarlen.serve.repository",
                 "ppvarlen.serve.dataplane", "ppvarlen.serve.batcher", "ppvarlen.serve.stats",
                 "ppvarlen.serve.prom", "ppvarlen.serve.errors", "ppvarlen.serve.openapi")


def module_name(path):
    rel = os.path.relpath(path, REPO)[:-len(".py")].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def imports(source, module, is_package=False):
    """Every module ``source`` imports, also inside functions (the suite's one import reader)."""
    return imported_modules(source, module, is_package, top_level_only=False)


def protocol_of(name):
    """The protocol a module name belongs to (``oip`` for ppvarlen.serve.protocols.oip.codec),
    '' for the registry itself, None outside protocols."""
    if name == PROTOCOLS:
        return ""
    if name.startswith(PROTOCOLS + "."):
        return name[len(PROTOCOLS) + 1:].split(".")[0]
    return None


def violations(module, imported):
    """What ``module`` must not import among ``imported``."""
    bad = []
    mine = protocol_of(module)
    for name in sorted(imported):
        theirs = protocol_of(name)
        if theirs is None:
            continue
        if module.startswith(PROTOCOL_FREE):
            bad.append(f"{module} imports the protocol module {name}")
        elif mine and theirs != mine:
            bad.append(f"protocol {mine} ({module}) imports {name}")
    return bad


def serve_modules():
    for root, _, files in os.walk(SERVE):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(root, f)
                yield path, module_name(path), f == "__init__.py"


def test_checker_catches_the_forms_it_names():
    cases = {
        ("ppvarlen.serve.repository", "from ppvarlen.serve.protocols.oip import codec"): True,
        ("ppvarlen.serve.http.edge", "def f():\n    from ..protocols import PROTOCOLS"): True,
        ("ppvarlen.serve.grpc.service", "import ppvarlen.serve.protocols.oip.grpc"): True,
        ("ppvarlen.serve.protocols.openai.routes",
         "from ppvarlen.serve.protocols.predict.routes import x"): True,
        ("ppvarlen.serve.protocols.openai.routes", "from ..predict import routes"): True,
        ("ppvarlen.serve.protocols.oip.grpc", "from . import codec\nfrom .routes import x"): False,
        ("ppvarlen.serve.dataplane", "from ppvarlen.serve.errors import shown"): False,
    }
    for (module, source), expected in cases.items():
        found = violations(module, imports(source, module))
        assert bool(found) == expected, (module, source, found)


def test_transports_and_the_models_side_know_no_protocol_and_protocols_not_each_other():
    bad = []
    for path, module, is_package in serve_modules():
        with open(path, encoding="utf-8") as f:
            bad += violations(module, imports(f.read(), module, is_package))
    assert not bad, "serve layering violated:\n" + "\n".join(bad)


def test_every_protocol_folder_is_registered():
    """A protocol folder is one registration line in protocols/__init__.py's PROTOCOLS."""
    from ppvarlen.serve import protocols

    folders = sorted(d for d in os.listdir(os.path.join(SERVE, "protocols"))
                     if os.path.isfile(os.path.join(SERVE, "protocols", d, "__init__.py")))
    assert sorted(p.__name__.rpartition(".")[2] for p in protocols.PROTOCOLS) == folders
    for p in protocols.PROTOCOLS:
        for attribute in ("router", "render_error", "add_openapi", "render_checks"):
            assert callable(getattr(p, attribute, None)), (p.__name__, attribute)
