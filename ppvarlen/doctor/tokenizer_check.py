"""Check 7: does the tokenizer fit the model (vocabulary vs embedding rows, special ids,
[CLS]/[SEP] expected and added)?  The vocabulary judgement is ``row_checks.vocabulary_problem``,
the one the serving admission check's smoke rows use."""
from ppvarlen.runtime.row_checks import InputRefused, ModelRaised, vocabulary_problem

from .report import FAIL, NOT_APPLICABLE, PASS, CheckResult

NAMES = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]"}


def _largest_id_row(model):
    """Every special id and the tokenizer's largest id in one row (as admission's smoke rows)."""
    tok = model.tokenizer
    body = sorted(set(tok.special_ids.values())) + [tok.vocab_size - 1]
    longest = model.longest_run()
    if longest is not None:
        body = body[:max(1, longest - model.specials())]
    return model.wrap(body)


def check_tokenizer(model, texts=None):
    title = "tokenizer <-> model"
    tok, rows = model.tokenizer, model.embedding_rows
    if tok is None:
        return CheckResult(7, title, NOT_APPLICABLE, "no tokenizer (pass --tokenizer DIR)" +
                           (f"; the embedding table has {rows} rows" if rows else ""),
                           {"embedding_rows": rows}, pitfalls=[42])
    problems = []
    static = vocabulary_problem(tok.vocab_size, rows)
    if static:
        problems.append(static)
    needed = ("pad", "unk") + (("cls", "sep") if tok.expects_wrap or tok.wraps else ())
    missing = [NAMES[k] for k in needed if k not in tok.special_ids]
    if missing:
        problems.append(f"the tokenizer has no {', '.join(missing)}")
    beyond = {NAMES.get(k, k): i for k, i in tok.special_ids.items() if rows and i >= rows}
    if beyond:
        problems.append(f"special ids outside the embedding table of {rows} rows: {beyond}")
    if tok.expects_wrap and not tok.wraps:
        problems.append("the model was trained on [CLS] text [SEP] but the serving path adds "
                        "no special tokens")
    probe = "not run"
    if model.run is not None:
        row = _largest_id_row(model)
        try:
            model.run([row])
            probe = f"a row of every special id and the largest id {tok.vocab_size - 1} runs"
        except InputRefused as e:
            probe = f"refused before the model ({e})"
        except ModelRaised as e:
            probe = f"fails: {e}"
            if not static:
                problems.append(vocabulary_problem(tok.vocab_size, run_error=str(e),
                                                   max_len=len(row)))
    config_pad = model.config.get("pad_token_id")
    evidence = {"vocab_size": tok.vocab_size, "embedding_rows": rows,
                "embedding_from": model.embedding_source, "special_ids": tok.special_ids,
                "expects_cls_sep": tok.expects_wrap, "adds_cls_sep": tok.wraps,
                "config_vocab_size": model.config.get("vocab_size"),
                "tokenizer_pad_id": tok.pad_id, "config_pad_token_id": config_pad,
                "largest_id_row": probe}
    specials = " ".join(f"{NAMES.get(k, k)} {i}" for k, i in tok.special_ids.items()
                        if k in NAMES)
    wrap = ("[CLS]/[SEP] expected and added" if tok.expects_wrap and tok.wraps else
            "[CLS]/[SEP] added" if tok.wraps else "no [CLS]/[SEP] added" +
            (" (none expected)" if tok.expects_wrap is False else ""))
    sizes = f"vocab {tok.vocab_size} vs {rows} embedding rows" if rows else \
        f"vocab {tok.vocab_size} (embedding table not found)"
    if problems:
        return CheckResult(7, title, FAIL, "; ".join(problems), evidence,
                           "serve with the tokenizer the model was trained with (its vocab.txt "
                           "and tokenizer_config.json), or grow the embedding to the vocabulary "
                           "and fine-tune; add [CLS]/[SEP] at serving exactly as at training",
                           [42])
    return CheckResult(7, title, PASS, f"{sizes}; {specials}; {wrap}; {probe}", evidence,
                       pitfalls=[42])
