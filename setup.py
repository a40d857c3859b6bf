"""Install entry point for ppvarlen.

CPU is the default: an editable install of this directory pulls the CPU wheel of
PaddlePaddle. GPU users install ``paddlepaddle-gpu==3.3.1`` from Paddle's CUDA index
first and set PPVARLEN_SKIP_PADDLE=1 for this install (see docs/guide/gpu.md, "GPU install").
"""
import os

from setuptools import find_packages, setup

# PaddleNLP 2.8.1 imports under Paddle 3.3.1 only with these upper bounds
# (newer huggingface_hub / aistudio-sdk / datasets break its import chain).
PADDLENLP_PINS = ["huggingface_hub<0.26", "aistudio-sdk<0.2", "datasets<3"]

# Set PPVARLEN_SKIP_PADDLE=1 when a GPU build of Paddle is already installed,
# so pip does not replace it with the CPU wheel.
PADDLE = [] if os.environ.get("PPVARLEN_SKIP_PADDLE") else ["paddlepaddle==3.3.1"]
# The docs site (mkdocs.yml; tests/test_docs_site.py builds it with --strict). The tutorials'
# runnable blocks are collected by tests/test_tutorials.py itself, so no collector package.
DOCS = ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings-python>=1.10"]
# Tested with Ray 2.60.0 (ray_serve uses Serve's late-bound ingress, __serve_build_asgi_app__).
RAY = ["ray[data,serve]>=2.60,<3"]
PARQUET = ["pyarrow>=14"]

# The commands, all in ppvarlen/cli.py; tools/*.py and deploy/python/*.py are shims over them.
CONSOLE_SCRIPTS = [
    "ppvarlen-train=ppvarlen.cli:main_train",
    "ppvarlen-eval=ppvarlen.cli:main_eval",
    "ppvarlen-export=ppvarlen.cli:main_export",
    "ppvarlen-lengths=ppvarlen.cli:main_lengths",
    "ppvarlen-pretrain=ppvarlen.cli:main_pretrain",
    "ppvarlen-infer=ppvarlen.cli:main_infer",
    "ppvarlen-serve=ppvarlen.cli:main_serve",
    "ppvarlen-bench=ppvarlen.cli:main_bench",
    "ppvarlen-check-gpu=ppvarlen.cli:main_check_gpu",
    "ppvarlen-config=ppvarlen.cli:main_config",
    "ppvarlen-doctor=ppvarlen.cli:main_doctor",
]

setup(
    name="ppvarlen",
    version="0.1.0",
    description="Variable-length text through PaddlePaddle: length-aware data, "
    "padding-invariant models, dynamic-shape export and a batching server.",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["ppvarlen", "ppvarlen.*"]),
    include_package_data=True,
    install_requires=PADDLE
    + [
        "paddlenlp==2.8.1",
        *PADDLENLP_PINS,
        "paddle2onnx==2.1.0",
        "onnx>=1.16,<1.18",
        "onnxruntime>=1.18",
        "onnxconverter-common>=1.14",
        # paddle2onnx's constant folding pip-installs these at run time when
        # they are missing; installing them here keeps run time offline.
        "onnx_graphsurgeon",
        "sympy",
        "pyyaml>=6",
        "numpy",
        "orjson>=3.9",  # JSONL lines parsed from their bytes (data/readers.py parse_json_bytes)
        "xxhash>=3",  # the stores' file checksums, verified before a run reads them (data/store.py)
        "tqdm",
        "safetensors>=0.4",
        "snownlp==0.12.3",
        "matplotlib",
        "fastapi",
        "uvicorn[standard]",  # httptools + uvloop: the pure-Python h11 parser caps QPS
        "httpx",
        "prometheus-client>=0.17",  # GET /metrics (ppvarlen/serve/prom.py)
        # the Open Inference Protocol over gRPC: the protocol's .proto files as Triton compiles
        # them (tritonclient.grpc's service_pb2 / model_config_pb2) and grpcio's server; [http]
        # too, so docs/SERVING.md's tritonclient.http example runs on this install
        "tritonclient[grpc,http]>=2.40",
        "grpcio>=1.60",
        # grpc.health.v1.Health on the gRPC port (Kubernetes gRPC probes); 1.77+ needs protobuf 7,
        # which tritonclient's compiled messages do not take
        "grpcio-health-checking>=1.60,<1.77",
    ],
    extras_require={
        # Ray Data batch inference and Ray Serve (ppvarlen.integrations, deploy/ray/);
        # ray 2.60.0 installs beside the pins above with `pip check` clean.
        "ray": RAY,
        # pytest-xdist: the README's test command runs the suite on 2 workers (whole files);
        # pytest-timeout: the per-test limit in pytest.ini; pytest-randomly: random test order
        # (seed printed); mutmut: benchmarks/mutation.py (docs/TESTING.md)
        "test": ["pytest>=7", "pytest-xdist>=3", "pytest-timeout>=2.3", "pytest-randomly>=3.15",
                 "mutmut>=3.3,<4", "hypothesis>=6", "scikit-learn", "seqeval",
                 "schemathesis>=4.30,<5", "tritonclient[http,grpc]>=2.40",
                 # the official client of the OpenAI API, against /v1/embeddings
                 "openai>=1.40",
                 # the ecosystem's clients in tests/serve/conformance: KServe's REST and gRPC
                 # clients (kserve pins pandas<3, psutil<6, python-dateutil<3) and LangChain's
                 # OpenAIEmbeddings
                 "kserve>=0.21,<0.22", "langchain-openai>=1.0",
                 # kserve's pandas<3 lets the resolver take paddlenlp's tool-helpers 0.1.2, which
                 # pins numpy<=1.26.4 and so breaks pyarrow (it needs numpy 2): keep numpy 2
                 "numpy>=2",
                 *PARQUET, *RAY, *DOCS],
        "docs": DOCS,
        # ppvarlen-infer's Parquet embedding output (and Parquet corpus input)
        "parquet": PARQUET,
        # ONNX Runtime's CUDA provider; both wheels install the same `onnxruntime` module:
        # `pip uninstall onnxruntime` first (docs/PRECISION.md)
        "onnxruntime-gpu": ["onnxruntime-gpu>=1.18"],
    },
    entry_points={"console_scripts": CONSOLE_SCRIPTS},
)
