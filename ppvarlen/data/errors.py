import errno

CHECK_DATA_FILES = "check Data.train_file / dev_file / test_file"


class DataError(ValueError):
    """Bad input data; the message names the file, line and field and says how to fix it."""


def unreadable_data_file(path, error, doing="read"):
    """The DataError for a data file the system would not ``doing`` (open, read): its path, the
    system's reason (``error``, an OSError) and the settings that name data files."""
    pipe = ("; a corpus is read more than once (hashed, then encoded): save what a pipe gives "
            "to a file and name that") if error.errno == errno.EINVAL else ""
    return DataError(f"{path}: cannot {doing} data file ({error.strerror}){pipe}; "
                     f"{CHECK_DATA_FILES}")
