"""ppvarlen-doctor: find the variable-length bugs in a model ppvarlen did not build.

``diagnose.diagnose(MODEL, tokenizer_dir, texts_file)`` loads MODEL the way it is deployed
(``sources``: a ppvarlen export, a PaddleNLP directory, a Paddle inference program or an ONNX
file), feeds it controlled batches and returns one ``report.CheckResult`` per check:

1. dynamic dimensions (``length_checks``)      5. float16 masks (``output_checks``)
2. padding invariance (``output_checks``)      6. position limits (``length_checks``)
3. batch invariance (``output_checks``)        7. tokenizer <-> model (``tokenizer_check``)
4. empty and 1-token rows (``output_checks``)  8. truncation on --texts (``length_checks``)

The finite-output, padding, batching and vocabulary judgements are
``ppvarlen.runtime.row_checks``, shared with the serving admission check.  Importing this
package imports nothing (``ppvarlen.cli`` reads ``errors`` at start-up).
"""
