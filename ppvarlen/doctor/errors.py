"""ModelLoadError: the model (or its tokenizer) cannot be loaded; ppvarlen-doctor exits 2."""


class ModelLoadError(ValueError):
    """The message names the file and what is missing or wrong in it."""
