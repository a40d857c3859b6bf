"""A config key's declaration (type, default, choices, meaning): the one shape the schema and the
model registry both use (paddle-free, imports nothing of ppvarlen)."""


class Field:
    def __init__(self, type_, default=None, choices=None, nullable=False, required=False, help="",
                 path=False):
        self.type = type_
        # a file or directory: written absolute into a resolved config.yaml, so the config
        # works from any directory (export --verify reads the data files again)
        self.path = path
        self.default = default
        self.choices = tuple(choices) if choices is not None else None
        self.nullable = nullable or default is None and not required
        self.required = required
        self.help = help

    def type_name(self):
        t = self.type
        if isinstance(t, tuple):
            return f"list of {t[1].__name__}"
        return t if isinstance(t, str) else t.__name__


def ListOf(item_type, default=None, **kw):
    return Field(("list", item_type), default, **kw)
