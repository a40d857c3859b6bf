"""Corpora, vocabulary, the encoded-corpus store, length-aware batching and padding.

Knows nothing of tasks/engine/export/deploy: a task hands its store fields and encode function
in (``data.dataset.open_datasets(data_cfg, resolve_task, ...)``)."""
