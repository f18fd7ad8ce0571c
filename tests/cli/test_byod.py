""" "Bring your own data" (README): the section's commands on a tiny model, one prompt across commands,
and bad input refused with one line, exit 2 and nothing written."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from cli_helpers import run

from privlm.errors import UserError
from privlm.experiments.config import parse_config
from privlm.lm.prompts import check_label_words, split_prompt
from privlm.resources.datasets import data_spec, load_dataset
from privlm.resources.labels import as_labels, with_template
from privlm.resources.models import load_model
from privlm.resources.verbalizers import Verbalizer
from privlm.synthesis.gradmm.prompt import build_prompt, encode_text
from privlm.training.data import load_task_data

README = Path(__file__).resolve().parents[2] / "README.md"
LABELS, TEMPLATE = "influenza=flu,common_cold=cold", "Clinical note: {text} Diagnosis:"
FLU = [
    "fever of 39 and chills",
    "high fever, aches and chills",
    "sudden fever and a bad cough",
    "aches, fever, exhausted",
]
COLD = ["runny nose, no fever", "mild sore throat and sneezing", "stuffy nose for two days", "sneezing, slight cough"]
FAST = {
    "synth": [
        "--length",
        "4",
        "--batch",
        "3",
        "--top-k",
        "8",
        "--outer-steps",
        "1",
        "--inner-steps",
        "2",
        "--seed",
        "1",
    ],
    "eval": ["--preset", "tiny", "--epochs", "2"],
    "train": ["--epochs", "2", "--max-length", "64", "--seed", "1"],
}


def readme_commands() -> list[list[str]]:
    """The ``privlm`` lines of the README's "Bring your own data" code block, as argv lists."""
    section = README.read_text().split("## Bring your own data", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)[1]
    return [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("privlm ")]


def write_notes(folder: Path, n_train: int = 24, n_test: int = 9) -> tuple[Path, Path]:
    rows = [(text, "influenza") for text in FLU] + [(text, "common_cold") for text in COLD]
    paths = folder / "notes_train.jsonl", folder / "notes_test.jsonl"
    for path, n in zip(paths, (n_train, n_test)):
        path.write_text(
            "".join(
                json.dumps({"text": f"{rows[i % 8][0]} (patient {i})", "label": rows[i % 8][1]}) + "\n"
                for i in range(n)
            )
        )
    return paths


def test_readme_commands_run_on_a_tiny_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    write_notes(tmp_path)
    commands = readme_commands()
    assert [argv[0] for argv in commands] == ["data", "synth", "eval", "train"]
    for argv in commands:
        speed = ["--model", "tiny-llama", *FAST[argv[0]]] if argv[0] in FAST else []
        code, out, err = run([*argv, *speed], capsys)
        assert code == 0, err
        if argv[0] == "synth":
            assert "its size is not released" in out and "24" not in out.split("private set:")[1].splitlines()[0]
            assert "24/" not in err and "reading the private examples" in err  # the progress line does not count N
            sidecar = json.loads(Path("notes_syn.privacy.json").read_text())
            assert "private_examples" not in sidecar and sidecar["private_data"] == "train=jsonl:notes_train.jsonl"
        if argv[0] == "eval":
            assert json.loads(out)["n_test"] == 9  # every row of the test file
    assert json.loads(Path("runs/notes/privacy.json").read_text())
    assert "n=9" in out  # privlm train scored every test row


def test_one_prompt_in_synth_train_eval_and_experiment(tmp_path: Path) -> None:
    train, test = write_notes(tmp_path)
    labels = with_template(as_labels(LABELS), TEMPLATE)
    spec = data_spec(train=str(train), test=str(test))
    _, tokenizer = load_model("tiny-llama")
    eval_verbalizer = load_dataset(spec, "test", labels=labels).verbalizer  # privlm eval
    synth_verbalizer = load_dataset(spec, None, labels=labels).verbalizer  # privlm synth
    train_verbalizer = load_task_data(spec, "classify", labels=labels).verbalizer  # privlm train
    config = parse_config(
        {
            "model": "tiny-llama",
            "train": str(train),
            "test": str(test),
            "pool_per_class": 2,
            "n_per_class": [1],
            "seeds": [0],
            "methods": {"random": {}},
            "template": TEMPLATE,
            "labels": {"influenza": "flu", "common_cold": "cold"},
        },
        "exp.toml",
    )
    experiment_verbalizer = load_dataset(config.data_spec(), "train", labels=config.labels).verbalizer
    assert eval_verbalizer == synth_verbalizer == train_verbalizer == experiment_verbalizer
    text = "fever and chills"
    assert eval_verbalizer.prompt(text) == "Clinical note: fever and chills Diagnosis: "
    prompt = build_prompt(tokenizer, synth_verbalizer.template, synth_verbalizer.label_words)
    assert prompt.completion(text, 0) == eval_verbalizer.completion(text, 0)
    gradmm_ids = encode_text(tokenizer, prompt, text, max_tokens=64)[1:]  # after the document start
    context, continuation = split_prompt(text, eval_verbalizer.template, "flu")
    assert tokenizer.decode(gradmm_ids) == context and continuation == " flu"


def test_label_words_that_encode_to_nothing_or_alike_are_refused() -> None:
    class Constant:  # a tokenizer that encodes every text as ``ids``
        def __init__(self, ids: list[int]) -> None:
            self.ids = ids

        def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
            return {"input_ids": self.ids}

    verbalizer = Verbalizer("{text} Diagnosis: ", ("flu", "cold"))
    with pytest.raises(UserError, match="label word 'flu' encodes to no tokens"):
        check_label_words(Constant([]), verbalizer)
    with pytest.raises(UserError, match="label words 'flu' and 'cold' encode to the same tokens"):
        check_label_words(Constant([7]), verbalizer)
    _, tokenizer = load_model("tiny-llama")
    check_label_words(tokenizer, verbalizer)  # distinct words, several tokens each: fine


@pytest.mark.parametrize(
    "change, message",
    [
        ({"--template": "Diagnosis:"}, "--template must contain {text} exactly once"),
        ({"--template": "{text} and {text}:"}, "'{text} and {text}:'"),
        ({"--labels": "influenza=flu,common_cold=flu"}, "label word 'flu' is given to two classes"),
        ({"--labels": "influenza= ,common_cold=cold"}, "class 'influenza' has an empty label word"),
        ({"--train": "empty.jsonl"}, "empty.jsonl: no examples"),
        ({"--test": "bad_test.jsonl"}, "bad_test.jsonl:2: label is not one of the 2 class names"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], change: dict, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    write_notes(tmp_path)
    Path("empty.jsonl").write_text("\n")
    Path("bad_test.jsonl").write_text('{"text": "rash", "label": "influenza"}\n{"text": "spots", "label": "measles"}\n')
    options = {"--train": "notes_train.jsonl", "--labels": LABELS, "--template": TEMPLATE, **change}
    base = [arg for key, value in options.items() if key != "--test" for arg in (key, value)]
    commands = [
        [
            "synth",
            *base,
            "--model",
            "tiny-llama",
            "--per-class",
            "1",
            "--epsilon",
            "4",
            "--delta",
            "1e-5",
            "--out",
            "syn.jsonl",
        ],
        [
            "train",
            *base,
            "--test",
            options.get("--test", "notes_test.jsonl"),
            "--model",
            "tiny-llama",
            "--epsilon",
            "3",
            "--max-length",
            "64",
            "--out",
            "run",
        ],
        ["eval", *base, "--test", options.get("--test", "notes_test.jsonl"), "--model", "tiny-llama"],
    ]
    if "--test" in change:
        commands = commands[1:]  # synth reads no test set
    for argv in commands:
        code, out, err = run(argv, capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            ["notes_train.jsonl", "notes_test.jsonl", "empty.jsonl", "bad_test.jsonl"]
        )
