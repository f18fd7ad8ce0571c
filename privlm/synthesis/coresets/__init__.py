"""``random``, ``herding``, ``k-center``: real subsets of the private pool (NON-PRIVATE references), selected
by :mod:`privlm.synthesis.coresets.selection`; adapters in :mod:`.method`."""

from __future__ import annotations

from privlm.synthesis.registry import NON_PRIVATE, Method, register_method

SUMMARIES = {
    "random": "n real examples per class, drawn at random",
    "herding": "n real examples per class whose feature mean tracks the class mean (herding)",
    "k-center": "n real examples per class covering the class's features (k-center greedy)",
}
for _kind, _summary in SUMMARIES.items():
    register_method(
        _kind,
        Method(
            f"privlm.synthesis.coresets.method:{_kind.replace('-', '_')}_rows",
            NON_PRIVATE + f" ({_kind} coreset of real examples)",
            summary=_summary,
        ),
    )
