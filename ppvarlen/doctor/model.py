"""``LoadedModel``: everything the checks read of one model, whatever it was loaded from."""
import numpy as np

from .feeding import describe

FALLBACK_VOCAB = 16  # ids drawn below this when neither a tokenizer nor a table says more


class LoadedModel:
    """A model as ``ppvarlen.doctor.sources`` loaded it.

    ``run`` is its row runner (``ppvarlen.runtime.row_checks``), None when the graph's inputs
    could not be mapped; ``graph`` the ``Graph`` of its file (None for a dygraph model);
    ``fp16`` a function returning (row runner, what it is) of a half-precision variant that
    runs here, or None."""

    def __init__(self, path, kind, runtime):
        self.path, self.kind, self.runtime = path, kind, runtime
        self.inputs, self.graph, self.run = [], None, None
        self.roles, self.unmapped, self.fed = {}, [], {}
        self.tokenizer, self.config = None, {}
        self.pad_id = 0
        self.embedding_rows = self.embedding_source = None
        self.max_position, self.max_position_sources = None, {}
        self.max_len = None  # the longest text the deployment takes (an export's max_len)
        self.long_text = None  # an export's long-text policy
        self.fixed_batch = self.fixed_length = None
        self.dygraph = False
        self.fp16 = None
        self.float32_only = None  # why no float16 variant of this model can serve, if none can
        self.notes = []

    # ------------------------------------------------------------ what the checks draw from
    def ids_input(self):
        return next((n for n, role in self.roles.items() if role == "ids"), None)

    def set_feeding(self, roles, unmapped, note=None):
        self.roles, self.unmapped = roles, unmapped
        self.fed = describe(roles, self.pad_id)
        if note:
            self.notes.append(note)

    def add_max_position(self, value, source):
        if value:
            self.max_position_sources[source] = int(value)
            self.max_position = min(self.max_position_sources.values())

    def id_range(self):
        """[low, high) of ordinary token ids: past the special ids, inside both the vocabulary
        and the embedding table."""
        low = self.tokenizer.first_regular_id() if self.tokenizer else 1
        tops = [n for n in (self.tokenizer and self.tokenizer.vocab_size, self.embedding_rows) if n]
        high = min(tops) if tops else FALLBACK_VOCAB
        if low >= high:
            low = 1 if high > 1 else 0
        return low, max(high, low + 1)

    def wrap(self, body):
        return self.tokenizer.wrap(body) if self.tokenizer else list(body)

    def specials(self):
        """Tokens the serving path adds around a text (0 or 2)."""
        return 2 if self.tokenizer and self.tokenizer.wraps else 0

    def random_row(self, rng, content_length):
        low, high = self.id_range()
        return self.wrap([int(i) for i in rng.randint(low, high, size=content_length)])

    def longest_run(self):
        """The longest row the checks may build: the fixed length, else the position table,
        else the deployment's max_len (None: no limit known)."""
        limits = [n for n in (self.fixed_length, self.max_position, self.max_len) if n]
        return min(limits) if limits else None

    def describe(self):
        return {"path": self.path, "kind": self.kind, "runtime": self.runtime,
                "inputs": [i.as_dict() for i in self.inputs], "fed": dict(self.fed),
                "unmapped": list(self.unmapped),
                "pad_id": int(self.pad_id),
                "tokenizer": self.tokenizer.as_dict() if self.tokenizer else None,
                "embedding_rows": self.embedding_rows, "max_position": self.max_position,
                "max_position_sources": dict(self.max_position_sources),
                "max_len": self.max_len, "long_text": self.long_text,
                "notes": list(self.notes)}


def seeded(seed=0):
    return np.random.RandomState(seed)
