"""``gradmm``: GRADMM's DP synthetic text — the DP release of the per-class last-layer gradient (:mod:`.release`),
closed-form matching (:mod:`.matching`), ADMM and generate-select (:mod:`.admm`, :mod:`.select`), projection,
filtering and the resumable pipeline (:mod:`.pipeline`); experiment adapter in :mod:`.method`, command in
:mod:`.command`."""

from __future__ import annotations

from privlm.synthesis.command import SynthCommand
from privlm.synthesis.gradmm.command import OPTIONS, PLAN
from privlm.synthesis.gradmm.config import GradmmConfig
from privlm.synthesis.registry import Method, config_params, register_method

register_method(
    "gradmm",
    Method(
        "privlm.synthesis.gradmm.method:gradmm_rows",
        "(ε, δ)-DP synthetic text at the cell's ε; NOT private when ε is 'none'; "
        "noise_only: public control, reads no private data",
        takes_epsilon=True,
        params=config_params(GradmmConfig, "preset"),
        summary="GRADMM: text whose last-layer gradient matches one DP release of the private data's (ADMM or generate-select; or drawn among candidates the release's one-step head agrees with)",
        synth="gradmm",
        command=SynthCommand(
            OPTIONS,
            "privlm.synthesis.gradmm.command:prepare",
            "privlm.synthesis.gradmm.pipeline:GradmmPaths",
            plan=PLAN,
        ),
    ),
)
