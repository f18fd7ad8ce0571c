"""``zero-shot`` (public instructions only) and ``few-shot`` (private examples in every prompt):
generation baselines of :mod:`privlm.synthesis.generation.baselines`, adapters in :mod:`.method`."""

from __future__ import annotations

from privlm.lm.sampling import SAMPLING_PARAMS
from privlm.synthesis.registry import NON_PRIVATE, PUBLIC, Method, register_method

GENERATION_PARAMS = frozenset({"instructions", *SAMPLING_PARAMS})
register_method(
    "zero-shot",
    Method(
        "privlm.synthesis.generation.method:zero_shot_rows",
        PUBLIC,
        params=GENERATION_PARAMS,
        summary="the public LM answers one public instruction per class, n times",
    ),
)
register_method(
    "few-shot",
    Method(
        "privlm.synthesis.generation.method:few_shot_rows",
        NON_PRIVATE + " (k private examples in every prompt)",
        params=GENERATION_PARAMS | {"k"},
        summary="the public LM writes new examples from k real examples of the class",
    ),
)
