"""What every protocol's OpenAPI part is built with: pydantic models as component schemas, an
answer with its JSON schema, the Retry-After header.

The server reads its inference bodies itself (to bound their size before parsing), so FastAPI
cannot infer a request schema from a handler argument: each protocol (``protocols/*/openapi``)
fills in its paths of the document FastAPI generates (``add_openapi``), from pydantic models
and the server's limits, with every status it answers and its error body.
"""


def schema_ref(model, components):
    """The model's JSON schema with its nested definitions moved into ``components``."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in schema.pop("$defs", {}).items():
        components[name] = definition
    components[schema.get("title", model.__name__)] = schema
    return {"$ref": f"#/components/schemas/{schema.get('title', model.__name__)}"}


def json_answer(schema, description, example=None, headers=None):
    """An OpenAPI response: JSON of ``schema`` (a reference), with an example and headers."""
    content = {"schema": schema}
    if example is not None:
        content["example"] = example
    out = {"description": description, "content": {"application/json": content}}
    if headers:
        out["headers"] = headers
    return out


RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying",
                               "schema": {"type": "string"}}}


