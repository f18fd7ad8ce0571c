"""``pe``: Private Evolution for text (Aug-PE) — mechanism in :mod:`.mechanism`, settings in :mod:`.config`,
experiment adapter in :mod:`.method`."""

from __future__ import annotations

from dataclasses import fields

from privlm.synthesis.pe.config import PEConfig
from privlm.synthesis.registry import Method, register_method

register_method(
    "pe",
    Method(
        "privlm.synthesis.pe.method:pe_rows",
        "(ε, δ)-DP synthetic text (Private Evolution) at the cell's ε; NOT private when ε is 'none'",
        takes_epsilon=True,
        params=frozenset(f.name for f in fields(PEConfig)) - {"seed"},
        summary="Private Evolution: public LM candidates evolved by T noisy nearest-neighbour vote histograms of the private data",
        synth="pe",
    ),
)
