"""ROUGE-1/2/L F-measures as an `evaluate.Metric`, computed by Google's `rouge-score` package.

Shipped with pipespec and loaded by path (`evaluate.load(<this directory>)`), so it works
offline. Inputs and options follow the hub's `rouge` metric:

    predictions      list of generated texts
    references       list of reference texts (one string per prediction), or a list of
                     references per prediction (the best-scoring one counts, as rouge-score's
                     `score_multi` does)
    rouge_types      default ["rouge1", "rouge2", "rougeL"]
    use_stemmer      Porter stemming (default True)
    use_aggregator   True (default): the mean F-measure over predictions per type; False: the
                     list of per-prediction F-measures

Unlike the hub's metric, the aggregate is the plain mean (the hub's reports the median of
bootstrap resamples): the same number every time, on a 0-1 scale.

Loaded by evaluate from a copy in its modules cache: it imports only installed libraries.
"""

import datasets
import evaluate
from rouge_score import rouge_scorer

DEFAULT_ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")

_CITATION = """\
@inproceedings{lin-2004-rouge,
    title = "{ROUGE}: A Package for Automatic Evaluation of Summaries",
    author = "Lin, Chin-Yew",
    booktitle = "Text Summarization Branches Out",
    year = "2004",
    publisher = "Association for Computational Linguistics",
    pages = "74--81",
}
"""

_DESCRIPTION = "ROUGE-N and ROUGE-L F-measures of predictions against references (rouge-score)."

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of texts to score.
    references: one reference text per prediction, or a list of reference texts per prediction.
    rouge_types: the ROUGE types to compute (default rouge1, rouge2, rougeL).
    use_stemmer: Porter-stem tokens before matching (default True).
    use_aggregator: mean over predictions (default True) or one F-measure per prediction.
Returns:
    {rouge_type: mean F-measure} or {rouge_type: [F-measure per prediction]}.
Examples:
    >>> rouge = evaluate.load("experiments/metrics/rouge")
    >>> rouge.compute(predictions=["the cat sat"], references=["the cat sat"])["rouge1"]
    1.0
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Rouge(evaluate.Metric):
    """ROUGE F-measures through rouge-score; the mean over predictions when aggregated."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
                ),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
            codebase_urls=["https://github.com/google-research/google-research/tree/master/rouge"],
            reference_urls=["https://pypi.org/project/rouge-score/"],
        )

    def _compute(self, predictions, references, rouge_types=None, use_stemmer=True, use_aggregator=True):
        types = list(rouge_types or DEFAULT_ROUGE_TYPES)
        scorer = rouge_scorer.RougeScorer(types, use_stemmer=use_stemmer)
        per_prediction = [_score(scorer, pred, ref) for pred, ref in zip(predictions, references)]
        scores = {name: [score[name].fmeasure for score in per_prediction] for name in types}
        if not use_aggregator:
            return scores
        return {name: sum(values) / len(values) if values else None for name, values in scores.items()}


def _score(scorer, prediction, reference):
    """rouge-score's scores of one prediction (its argument order is target, prediction)."""
    if isinstance(reference, str):
        return scorer.score(reference, prediction)
    return scorer.score_multi(reference, prediction)
