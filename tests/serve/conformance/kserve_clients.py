"""KServe's REST and gRPC clients against a server, in a process of their own: KServe compiles
the protocol's messages under the same package name (``inference``) as tritonclient, and
protobuf's default descriptor pool refuses the second (``duplicate symbol``), so one process
cannot import both.  ``python kserve_clients.py URL GRPC_URL MODEL TEXT...`` prints one JSON
object: each transport's readiness, answer id, model name and ``probs`` rows."""
import asyncio
import json
import sys

import numpy as np
from kserve import (InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest,
                    RESTConfig)


def request(name, texts):
    tensor = InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=np.object_), binary_data=False)
    return InferRequest(model_name=name, infer_inputs=[tensor], request_id="r-1")


def summary(answer, ready):
    probs = next(o for o in answer.outputs if o.name == "probs").as_numpy()
    return {"ready": ready, "id": answer.id, "model_name": answer.model_name,
            "probs": np.asarray(probs, np.float64).tolist()}


async def main(url, grpc_url, name, texts):
    rest = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
    try:
        ready = (await rest.is_server_ready(url)
                 and await rest.is_model_ready(url, name))
        rest_answer = summary(await rest.infer(url, request(name, texts), model_name=name),
                              ready)
    finally:
        await rest.close()
    client = InferenceGRPCClient(grpc_url, timeout=60)
    try:
        ready = await client.is_server_ready() and await client.is_model_ready(name)
        grpc_answer = summary(await client.infer(request(name, texts)), ready)
    finally:
        await client.close()
    return {"rest": rest_answer, "grpc": grpc_answer}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))))
