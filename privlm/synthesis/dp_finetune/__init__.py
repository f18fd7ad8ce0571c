"""``dp-finetune-gen``: DP fine-tune, then generate — mechanism in :mod:`.mechanism`, settings in :mod:`.config`,
experiment adapter in :mod:`.method`."""

from __future__ import annotations

from privlm.synthesis.command import SynthCommand
from privlm.synthesis.dp_finetune.command import OPTIONS, PLAN
from privlm.synthesis.dp_finetune.config import DPFinetuneConfig
from privlm.synthesis.registry import Method, config_params, register_method

register_method(
    "dp-finetune-gen",
    Method(
        "privlm.synthesis.dp_finetune.method:dp_finetune_rows",
        "(ε, δ)-DP synthetic text sampled from a model DP fine-tuned (DP-SGD, LoRA) at the cell's ε; NOT private "
        "when ε is 'none' (the same run with σ = 0)",
        takes_epsilon=True,
        params=config_params(DPFinetuneConfig),
        summary="DP-SGD (LoRA, hutchinson norms) on public class prompt + private text, then sampling n per class",
        synth="dp-finetune",
        command=SynthCommand(
            OPTIONS,
            "privlm.synthesis.dp_finetune.command:prepare",
            "privlm.synthesis.dp_finetune.mechanism:DPFinetunePaths",
            plan=PLAN,
            dp_only=True,
        ),
    ),
)
