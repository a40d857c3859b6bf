"""The Open Inference Protocol v2 (KServe / Triton), REST and gRPC."""
