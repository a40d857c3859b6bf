class DataError(ValueError):
    """Bad input data; the message names the file, line and field and says how to fix it."""
