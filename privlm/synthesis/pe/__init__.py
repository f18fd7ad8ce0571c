"""``pe``: Private Evolution for text (Aug-PE) — mechanism in :mod:`.mechanism`, settings in :mod:`.config`,
experiment adapter in :mod:`.method`."""

from __future__ import annotations

from privlm.synthesis.command import SynthCommand
from privlm.synthesis.pe.command import OPTIONS, PLAN
from privlm.synthesis.pe.config import PEConfig
from privlm.synthesis.registry import Method, config_params, register_method

register_method(
    "pe",
    Method(
        "privlm.synthesis.pe.method:pe_rows",
        "(ε, δ)-DP synthetic text (Private Evolution) at the cell's ε; NOT private when ε is 'none'; "
        "noise_only: public control, reads no private data",
        takes_epsilon=True,
        params=config_params(PEConfig, "noise_only"),
        summary="Private Evolution: public LM candidates evolved by T noisy nearest-neighbour vote histograms of the private data",
        synth="pe",
        command=SynthCommand(
            OPTIONS, "privlm.synthesis.pe.command:prepare", "privlm.synthesis.pe.mechanism:PEPaths", plan=PLAN
        ),
    ),
)
