"""Per-task defaults of ``privlm train``: classify trains the label-word head unless a model setting is given."""

from __future__ import annotations

from privlm.training.recipe import HEAD_ONLY, OTHER, defaults

UNSET = {
    "head_only": None,
    "lora": None,
    "lora_layers": None,
    "batch_size": None,
    "epochs": None,
    "lr": None,
    "max_length": None,
}


def test_classify_defaults_to_the_head_only_recipe_and_given_values_win():
    chosen = defaults("classify", {**UNSET, "lr": 0.5})
    assert chosen["head_only"] is True and chosen["lr"] == 0.5
    assert chosen["batch_size"] == HEAD_ONLY["batch_size"] and chosen["epochs"] == HEAD_ONLY["epochs"]


def test_lora_no_head_only_or_the_lm_task_keep_the_earlier_defaults():
    for task, given in (
        ("classify", {"lora": 4}),
        ("classify", {"lora": 0}),
        ("classify", {"head_only": False}),
        ("lm", {}),
    ):
        chosen = defaults(task, {**UNSET, **given})
        assert chosen["head_only"] is False, (task, given)
        assert (chosen["batch_size"], chosen["epochs"], chosen["lr"]) == (
            OTHER["batch_size"],
            OTHER["epochs"],
            OTHER["lr"],
        )
