"""The defaults that ``privlm synth``'s option help states ("(default 40)") are the method configs' own.

The help is written out by hand, so that ``privlm --help`` imports no method code (and no torch); this test is what
keeps the two from drifting apart when a config default (or a preset's value) changes."""

from __future__ import annotations

import re
from inspect import signature
from types import SimpleNamespace
from typing import Any

import pytest

from privlm.synthesis.command import SynthOption
from privlm.synthesis.dp_finetune.command import OPTIONS as DP_FINETUNE
from privlm.synthesis.dp_finetune.config import DPFinetuneConfig
from privlm.synthesis.dp_head_pool.command import OPTIONS as DP_HEAD_POOL
from privlm.synthesis.dp_head_pool.labeller import LabellerConfig
from privlm.synthesis.gradmm.command import OPTIONS as GRADMM
from privlm.synthesis.gradmm.config import make_config
from privlm.synthesis.pe.command import OPTIONS as PE
from privlm.synthesis.pe.config import PEConfig

# each method's options, and the configs (in order) that hold the defaults a run starts from: dp-head-pool's
# recipe options set its labeller, its candidate options the "instruct" preset of GRADMM's config (the preset it
# uses); gradmm's options the preset make_config starts from when none is given (as the command does) and its config
CASES = {
    "dp-finetune": (DP_FINETUNE, (DPFinetuneConfig(),)),
    "dp-head-pool": (DP_HEAD_POOL, (LabellerConfig(), make_config("instruct"))),
    "gradmm": (
        GRADMM,
        (SimpleNamespace(preset=signature(make_config).parameters["preset"].default), make_config()),
    ),
    "pe": (PE, (PEConfig(),)),
}
STATED = re.compile(r"\(default ([^)]+)\)")


def _default(field: str, configs: tuple[object, ...]) -> Any:
    for config in configs:
        if hasattr(config, field):
            return getattr(config, field)
    raise AssertionError(f"no config among {configs} has the field {field!r}")


def _as_help(value: Any) -> str:
    """How the help writes a default: on/off for a switch, numbers without trailing zeros (40.0 as 40)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)):
        return format(value, "g")
    return str(value)


def _mismatches(options: tuple[SynthOption, ...], configs: tuple[object, ...]) -> list[str]:
    """Each option whose help states a default other than its config's; raises if no option states one."""
    stated = [(option, STATED.search(option.help)) for option in options]
    checked = [(option, match.group(1)) for option, match in stated if match]
    assert checked, "no option states a default (the check would check nothing)"
    return [
        f"{option.flag}: help says {text}, the config {_as_help(_default(option.field, configs))}"
        for option, text in checked
        if text != _as_help(_default(option.field, configs))
    ]


@pytest.mark.parametrize("method", sorted(CASES))
def test_each_stated_default_is_the_configs(method: str) -> None:
    assert _mismatches(*CASES[method]) == []


def test_a_drifted_default_is_caught() -> None:
    """The check fails when the help and the config disagree: a recipe whose epochs became 30, a switch turned off."""

    drifted = SimpleNamespace(epochs=30.0, label_filter=False)
    assert _mismatches(DP_HEAD_POOL, (drifted, LabellerConfig(), make_config("instruct"))) == [
        "--epochs: help says 40, the config 30",
        "--label-filter/--no-label-filter: help says on, the config off",
    ]
