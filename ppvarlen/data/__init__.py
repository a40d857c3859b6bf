"""Corpora, vocabulary, length-aware batching and padding. Knows nothing of engine/export/deploy."""
