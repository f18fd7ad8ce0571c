"""``dp-head-pool``: GRADMM's public candidate pool, drawn among the candidates that a DP-SGD-trained head-only
classifier of the private data also gives their class — labeller in :mod:`.labeller`, experiment adapter in
:mod:`.method`, ``privlm synth --method dp-head-pool`` in :mod:`.command`."""

from __future__ import annotations

from privlm.synthesis.command import SynthCommand
from privlm.synthesis.dp_head_pool.command import OPTIONS, PLAN
from privlm.synthesis.registry import Method, register_method

register_method(
    "dp-head-pool",
    Method(
        "privlm.synthesis.dp_head_pool.method:dp_head_pool_rows",
        "(ε, δ)-DP: public candidates chosen by a head-only classifier DP-SGD trained at the cell's ε "
        "(post-processing of that release); noise_only: control, reads only the pool's size (public, as in any DP-SGD run)",
        takes_epsilon=True,
        params=frozenset(
            {"preset", "pool_seed", "batch", "oversample", "label_filter", "instruction", "instructions"}
            | {"epochs", "batch_size", "lr", "max_grad_norm", "norm_mode", "noise_only"}
        ),
        summary="n of GRADMM's label-filtered public candidates per class, drawn among those a DP-SGD-trained "
        "head-only classifier also gives their class",
        synth="dp-head-pool",
        command=SynthCommand(
            OPTIONS,
            "privlm.synthesis.dp_head_pool.command:prepare",
            "privlm.synthesis.dp_head_pool.command:DPHeadPoolPaths",
            plan=PLAN,
            dp_only=True,
        ),
    ),
)
