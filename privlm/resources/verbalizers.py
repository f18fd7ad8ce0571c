"""Verbalizers: how a classification example becomes a next-word prediction for a causal LM.

An example ``(text, label)`` is read as a prompt — the verbalizer's *template* with ``{text}`` replaced
by the text — followed by the label's word, e.g. ``"{text} It was "`` gives ``"a fine film It was "`` +
``"great"``. :func:`fill` is the one function that builds a prompt: scoring, fine-tuning, private training,
GRADMM's release, matching and filtering, and the experiment all take their prompts from it. Tokenization
(moving the prompt's trailing space onto the word) is :mod:`privlm.lm.prompts`' concern; here we
only fix the strings.

Built-in verbalizers (suffix; one word per class, in label order):

- ``rotten-tomatoes``: ``" It was "``; bad, great.
- ``tweets``: ``" Does the tweet express joy or sadness? "``; sadness, joy.
- ``tweets-3class``: ``" Is the tweet negative, neutral or positive? "``; negative, neutral, positive.
- ``bbc-news``: ``" This news article is about "``; business, entertainment, politics, sports, technology.
- user files (``jsonl:``, ``csv:``, ``hf:``): ``"{text} Label: "``, or the user's ``--template`` (TOML
  ``template``), which must hold ``{text}`` once (e.g. ``"Note: {text} Diagnosis:"``; a template that
  does not end in whitespace is followed by one space before the word); the words given with
  ``--labels NAME=WORD``, else the label names (all public input, never read off the data).

The rotten-tomatoes verbalizer and the tweets question follow the GRADMM reference code (``docs/data.md``,
"Built-in data sets"); the tweets label words and the other verbalizers are ours (each word names its
class). With SmolLM2's tokenizer every label word, with its leading space, is one token, distinct within
its task (checked by the slow test).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from string import Formatter

from privlm.errors import UserError

TEXT = "{text}"
INSTRUCTION_FIELDS = ("label_name", "label_word", "prompt")


def fill(template: str, text: str) -> str:
    """The prompt of ``text``: ``template`` with its ``{text}`` replaced (a template without ``{text}`` is
    a suffix: ``text + template``). The one function that builds prompts."""
    return template.replace(TEXT, text, 1) if TEXT in template else text + template


def split_template(template: str) -> tuple[str, str]:
    """``(before, after)``: the template's text before and after ``{text}``."""
    before, _, after = template.rpartition(TEXT) if TEXT in template else ("", "", template)
    return before, after


def check_template(template: str, source: str = "--template") -> str:
    """A user template, ready to :func:`fill`: exactly one ``{text}``; a space is added after it unless
    it ends in whitespace (the label word follows). :class:`UserError` names ``source`` and the value."""
    if template.count(TEXT) != 1:
        raise UserError(f"{source} must contain {TEXT} exactly once (where the example's text goes), got {template!r}")
    return template if template[-1:].isspace() else template + " "


def check_instruction(instruction: str, source: str = "--instruction") -> str:
    """A generation instruction template (public), unchanged, or :class:`UserError` naming ``source``: its
    fields are among ``{label_name}``, ``{label_word}`` and ``{prompt}``, and it names the class by
    ``{label_name}`` or ``{label_word}`` (else every class would get the same instruction)."""
    try:
        names = {name for _, name, _, _ in Formatter().parse(instruction) if name is not None}
    except ValueError as exc:
        raise UserError(
            f"{source} {instruction!r} is not a valid template ({exc}); write a literal brace as {{{{ or }}}}"
        ) from exc
    unknown = sorted(names - set(INSTRUCTION_FIELDS))
    if unknown:
        raise UserError(
            f"{source} {instruction!r} has the unknown field {{{unknown[0]}}}; "
            "the fields are {label_name}, {label_word} and {prompt}"
        )
    if not names & {"label_name", "label_word"}:
        raise UserError(f"{source} {instruction!r} must name the class by {{label_name}} or {{label_word}}")
    return instruction


def format_instructions(
    instruction: str, template: str, label_names: Sequence[str], label_words: Sequence[str]
) -> list[str]:
    """One generation instruction per class: ``instruction`` with the class's ``{label_name}`` and
    ``{label_word}`` and the verbalizer's ``{prompt}`` (``template`` filled with ``"..."``, trailing
    space dropped) filled in. The one function that formats instruction templates: the zero/few-shot
    baselines' (:meth:`Verbalizer.instructions`) and GRADMM's instructed candidates."""
    shown = fill(template, "...").rstrip()
    return [
        instruction.format(label_name=name, label_word=word, prompt=shown)
        for name, word in zip(label_names, label_words)
    ]


@dataclass(frozen=True)
class Verbalizer:
    """Prompt template plus one label word per class (``label_words[i]`` verbalizes label ``i``);
    ``instruction``: the zero/few-shot generation baselines' instruction for a class (``{label_name}``,
    ``{label_word}`` and ``{prompt}`` are filled in), ``None`` for their built-in default."""

    template: str
    label_words: tuple[str, ...]
    instruction: str | None = None

    def prompt(self, text: str) -> str:
        """The context the LM continues: the template filled with ``text``."""
        return fill(self.template, text)

    def completion(self, text: str, label: int) -> str:
        """The full verbalized example: ``prompt(text) + label_words[label]``."""
        return self.prompt(text) + self.label_words[label]

    def instructions(self, label_names: tuple[str, ...]) -> list[str] | None:
        """One generation instruction per class, or ``None`` (the baselines' default)."""
        if self.instruction is None:
            return None
        return format_instructions(self.instruction, self.template, label_names, self.label_words)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form: ``{"template": ..., "label_words": [...]}``."""
        return {"template": self.template, "label_words": list(self.label_words)}


SENTIMENT = Verbalizer("{text} It was ", ("bad", "great"))
# Built-ins other than movie reviews name their own generation instruction (zero/few-shot baselines,
# GRADMM's instructed candidates, PE's and dp-finetune's class prompts); SENTIMENT keeps the default.
TWEETS = Verbalizer(
    "{text} Does the tweet express joy or sadness? ",
    ("sadness", "joy"),
    "Write one short tweet that expresses {label_word}.",
)
TWEETS_3CLASS = Verbalizer(
    "{text} Is the tweet negative, neutral or positive? ",
    ("negative", "neutral", "positive"),
    "Write one short tweet with a {label_word} tone.",
)
BBC_NEWS = Verbalizer(
    "{text} This news article is about ",
    ("business", "entertainment", "politics", "sports", "technology"),
    "Write the first two sentences of a news article about {label_word}.",
)
GENERIC_TEMPLATE = "{text} Label: "
GENERIC_INSTRUCTION = 'Write one short text for "{prompt} {label_word}".'
DESCRIBE_HELP = (
    "Public description of one example of a class, naming the class by {label_name} (or {label_word}), e.g. "
    '"{label_name} movie review sentence": every generation-based method then asks the public model to '
    '"Write one short <description>." Never derived from the rows (like --labels).'
)


def description_instruction(description: str, source: str = "--describe") -> str:
    """The generation instruction of a user data set's public ``description`` (one example of a class, with
    ``{label_name}`` or ``{label_word}``): ``"Write one short <description>."``; :class:`UserError` naming
    ``source`` for an empty description or one that does not name the class."""
    text = description.strip().rstrip(".")
    if not text:
        raise UserError(f"{source} is empty; {DESCRIBE_HELP}")
    return check_instruction(f"Write one short {text}.", source)


def generic_verbalizer(
    label_names: tuple[str, ...],
    words: tuple[str, ...] | None = None,
    template: str | None = None,
    description: str | None = None,
) -> Verbalizer:
    """Verbalizer of a user-supplied dataset: ``template`` (checked by :func:`check_template`; default
    ``"{text} Label: "``), the given ``words`` (one per class), else the label names as words. Words must
    be non-empty and distinct. Its generation instruction comes from the public ``description``
    (:func:`description_instruction`), else the generic :data:`GENERIC_INSTRUCTION`, which makes the public
    model write *about* the prompt rather than in the data's domain (:func:`undescribed`)."""
    words = tuple(label_names) if words is None else tuple(words)
    if len(words) != len(label_names) or any(not word.strip() for word in words):
        raise UserError(f"label words must be non-empty, one per class, got {list(words)}")
    repeated = sorted({word for word in words if words.count(word) > 1})
    if repeated:
        raise UserError(f"--labels: label word {repeated[0]!r} is given to two classes; each class needs its own word")
    instruction = GENERIC_INSTRUCTION if description is None else description_instruction(description)
    return Verbalizer(GENERIC_TEMPLATE if template is None else check_template(template), words, instruction)


def undescribed(verbalizer: Verbalizer) -> bool:
    """Whether generation-based methods would fall back to the generic instruction (user data given
    without ``--describe``)."""
    return verbalizer.instruction == GENERIC_INSTRUCTION


NO_DESCRIPTION_WARNING = (
    "no --describe: generation-based methods (GRADMM instruct, PE, dp-finetune-gen, zero-shot) will ask the "
    'public model to "' + GENERIC_INSTRUCTION + '", which writes about the prompt rather than in your '
    "data's domain (on a held-out sentiment set: 55.3 % downstream accuracy against 72.7 % with a one-line "
    'description); give a public description, e.g. --describe "{label_name} movie review sentence"'
)
