"""Which graph input gets what: token ids, segment ids, a keep mask, lengths or position ids.

``map_inputs`` names each input's role from its name (``input_ids``, ``token_type_ids``,
``attention_mask``, ``seq_len``, ``position_ids`` and their usual spellings); an input no rule
names leaves the graph unmapped, and the doctor then reports the inputs instead of guessing.
One exception is said in the report: a graph whose only input is a rank-2 integer tensor gets
the token ids there.  ``Feeder`` turns id rows into the arrays of those inputs, right-padded
with the pad id, at the graph's fixed length when it has one.
"""
import re

import numpy as np

from ppvarlen.runtime.row_checks import InputRefused

# role -> (exact normalised names, substrings tried after every exact name failed)
ROLES = {
    "positions": (("position_ids", "pos_ids", "positions", "position"), ("position", "pos_id")),
    "segments": (("token_type_ids", "segment_ids", "sent_ids", "type_ids", "token_type",
                  "segment_ids_0"), ("type", "segment")),
    "mask": (("attention_mask", "input_mask", "mask", "padding_mask", "attn_mask"), ("mask",)),
    "lengths": (("seq_len", "seq_lens", "seq_length", "length", "lengths", "sequence_length",
                 "src_len", "lens", "input_len"), ("len",)),
    "ids": (("input_ids", "src_ids", "ids", "token_ids", "input", "inputs", "word_ids",
             "input_ids_0", "x"), ("ids", "input", "token")),
}
RANKS = {"ids": 2, "segments": 2, "mask": 2, "positions": 2, "lengths": 1}
WHAT = {"ids": "token ids, right-padded with the pad id {pad}",
        "segments": "segment ids, all 0 (one text)",
        "mask": "1 on real tokens, 0 on pads",
        "lengths": "each row's real length",
        "positions": "0, 1, ... along every row"}


def _normalise(name):
    return re.sub(r"[^a-z0-9_]", "_", name.lower().split(":")[0]).strip("_")


def map_inputs(inputs):
    """({input name: role}, [names no rule maps], note or None)."""
    roles, unmapped = {}, []
    for graph_input in inputs:
        name = _normalise(graph_input.name)
        role = next((r for r, (exact, _) in ROLES.items() if name in exact), None)
        role = role or next((r for r, (_, parts) in ROLES.items()
                             if any(p in name for p in parts)), None)
        rank = len(graph_input.shape) if graph_input.shape is not None else None
        if role is None or role in roles.values() or rank not in (None, RANKS[role]):
            unmapped.append(graph_input.name)
        else:
            roles[graph_input.name] = role
    note = None
    if unmapped and len(inputs) == 1 and inputs[0].shape is not None and \
            len(inputs[0].shape) == 2 and inputs[0].dtype.startswith("int"):
        roles, unmapped = {inputs[0].name: "ids"}, []
        note = f"the only input {inputs[0].name!r} (rank 2, {inputs[0].dtype}) takes the token ids"
    if not unmapped and "ids" not in roles.values():
        unmapped = list(roles)
        roles = {}
    return roles, unmapped, note


def describe(roles, pad_id):
    """{input name: what the doctor feeds it}, for the report."""
    return {name: WHAT[role].format(pad=pad_id) for name, role in roles.items()}


class Feeder:
    """Id rows -> {input name: array} for a graph's mapped inputs."""

    def __init__(self, inputs, roles, pad_id, fixed_length=None):
        self.inputs = [i for i in inputs if i.name in roles]
        self.roles, self.pad_id, self.fixed_length = roles, int(pad_id), fixed_length

    def width(self, rows, width=None):
        longest = max([len(r) for r in rows] + [int(width or 0), 1])
        if self.fixed_length is None:
            return longest
        if longest > self.fixed_length:
            raise InputRefused(f"the graph takes exactly {self.fixed_length} positions; a row "
                               f"of {longest} does not fit")
        return self.fixed_length

    def arrays(self, rows, width=None):
        """({input name: array}, seq_len) for ``rows`` padded to ``width`` (or the longest
        row; always the fixed length when the graph has one)."""
        width = self.width(rows, width)
        seq_len = np.array([len(r) for r in rows], dtype=np.int64)
        real = np.arange(width)[None, :] < seq_len[:, None]
        feeds = {}
        for graph_input in self.inputs:
            role, dtype = self.roles[graph_input.name], np.dtype(_numpy_dtype(graph_input.dtype))
            if role == "ids":
                ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
                for r, row in enumerate(rows):
                    ids[r, :len(row)] = row
                value = ids
            elif role == "segments":
                value = np.zeros((len(rows), width))
            elif role == "mask":
                value = real
            elif role == "lengths":
                value = seq_len
            else:
                value = np.broadcast_to(np.arange(width), (len(rows), width))
            feeds[graph_input.name] = np.ascontiguousarray(value.astype(dtype))
        return feeds, seq_len


def _numpy_dtype(name):
    """A graph's dtype name -> numpy's (an unknown one is fed as int64, the ids' usual type)."""
    try:
        return np.dtype(name).name
    except TypeError:
        return "int64"
