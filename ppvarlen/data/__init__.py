"""Corpora, vocabulary, the encoded-corpus store, length-aware batching and padding.

Knows nothing of tasks/engine/export/deploy: the corpus is read into plain records
(``data.sources``) that the store build above the tasks (``ppvarlen.store_build``) encodes."""
