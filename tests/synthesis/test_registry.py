"""The one method registry: every method registers itself, cheaply, and the README's table is the registry's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from privlm.errors import UserError
from privlm.synthesis.registry import get_method, load_methods, methods_table, synth_methods

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_method_is_registered_and_synth_reads_the_registry() -> None:
    names = set(load_methods())
    assert {
        "gradmm",
        "pe",
        "dp-finetune-gen",
        "zero-shot",
        "few-shot",
        "random",
        "herding",
        "k-center",
        "full-pool",
    } <= names
    assert synth_methods() == {
        "gradmm": "gradmm",
        "pe": "pe",
        "dp-finetune": "dp-finetune-gen",
        "dp-head-pool": "dp-head-pool",
    }
    assert get_method("pe@fast") is get_method("pe") and get_method("pe").takes_epsilon
    with pytest.raises(UserError, match="unknown method 'magic'"):
        get_method("magic")


def test_the_readme_table_is_the_registrys() -> None:
    assert methods_table() in README.read_text()


def test_loading_the_registry_imports_no_torch() -> None:
    code = (
        "import sys\nfrom privlm.synthesis.registry import load_methods\nload_methods()\n"
        "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "[]"


def test_config_methods_take_their_config_fields_but_seed_and_sampling_settings_are_listed_once() -> None:
    from dataclasses import fields

    from privlm.lm.sampling import SAMPLING_PARAMS, Sampling
    from privlm.synthesis.dp_finetune.config import DPFinetuneConfig
    from privlm.synthesis.gradmm.config import GradmmConfig
    from privlm.synthesis.pe.config import PEConfig

    for name, config, extra in (
        ("pe", PEConfig, {"noise_only"}),
        ("dp-finetune-gen", DPFinetuneConfig, set()),
        ("gradmm", GradmmConfig, {"preset"}),
    ):
        assert get_method(name).params == {f.name for f in fields(config)} - {"seed"} | extra
    assert SAMPLING_PARAMS == ("max_new_tokens", "temperature", "top_p")
    assert set(SAMPLING_PARAMS) < get_method("zero-shot").params < get_method("few-shot").params
    assert Sampling.from_params({"top_p": 0.5, "k": 3}) == Sampling(top_p=0.5)
    for config in (PEConfig(max_new_tokens=6, temperature=0.7, top_p=0.9), DPFinetuneConfig(top_p=0.8)):
        assert Sampling.from_params(config.to_dict()) == Sampling(
            config.max_new_tokens, config.temperature, config.top_p
        )
    assert PEConfig(max_new_tokens=6).sampling == Sampling(max_new_tokens=6)
    assert "top_p" not in DPFinetuneConfig().training_dict() and "lr" in DPFinetuneConfig().training_dict()
