"""Public class names (and optional label words) of user data: ``--labels`` and the TOML ``labels`` key.

**Class names are public input.** The list of classes of a user data set (``jsonl:``, ``csv:``, an
``hf:`` data set without a ``ClassLabel`` column) is given by the user, never read off the private
rows: if it were, adding one record labelled ``"hiv_positive"`` would change the class list, the prompt,
the release metadata and every output row's ``label_name`` — a deterministic leak (ε = ∞). The names,
their order and their words are therefore part of the mechanism's public description, like the model.

The prompt template (``--template "Note: {text} Diagnosis:"``, TOML ``template``) travels with them:
:func:`with_template` puts it on the spec, so every consumer of the classes gets the same verbalizer.

Syntax (one option or TOML key carries names and words together):

- command line: ``--labels negative,positive`` or ``--labels negative=bad,positive=great``
  (``NAME=WORD``: WORD is that class's label word; without it the word is the name);
- TOML: ``labels = ["negative", "positive"]`` (items may also be ``"NAME=WORD"``) or
  ``labels = {negative = "bad", positive = "great"}`` (a table: name = word, in order).

Names are non-empty, distinct, at least two, without ``,`` or ``=`` on the command line; a name made of
digits must be its own position (``--labels 0,1`` is fine, ``--labels 1,0`` is refused), so a label read
from a file means the same class whether it is taken as a name or as an index. A row's label is
either one of the names or a class index ``0..K-1`` (an integer, or digits in a CSV file); anything else
is a :class:`UserError` that names the file and line but never the label (the label is private).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from privlm.errors import UserError

_DIGITS = re.compile(r"[0-9]+")
SYNTAX = (
    "--labels NAME,NAME,... (e.g. --labels negative,positive; --labels negative=bad,positive=great "
    'also sets each class\'s label word; TOML: labels = ["negative", "positive"])'
)


@dataclass(frozen=True)
class LabelSpec:
    """The public classes of a data set: ``names[k]`` is class ``k``; ``words[k]`` its label word, or
    ``None`` for "the name itself"; ``template``: the prompt template (``None``: the default);
    ``description``: the public description generation methods write from (``--describe``; ``None``: none)."""

    names: tuple[str, ...]
    words: tuple[str | None, ...]
    template: str | None = None
    description: str | None = None

    def __post_init__(self) -> None:
        if len(self.words) != len(self.names):
            raise ValueError("one word (or None) per name")

    @property
    def label_words(self) -> tuple[str, ...]:
        """The label word of every class (the name where no word was given)."""
        return tuple(name if word is None else word for name, word in zip(self.names, self.words))

    @property
    def has_words(self) -> bool:
        """Whether any class was given its own word."""
        return any(word is not None for word in self.words)

    def option(self) -> str:
        """The ``--labels`` value that gives this spec back."""
        return ",".join(name if word is None else f"{name}={word}" for name, word in zip(self.names, self.words))

    def class_of(self, label: str) -> int | None:
        """The class of a raw label read from data: its position among the names, else the index it
        spells (``0..K-1``), else ``None``."""
        label = label.strip()
        if label in self.names:
            return self.names.index(label)
        if _DIGITS.fullmatch(label) and int(label) < len(self.names):
            return int(label)
        return None


def parse_labels(text: str, source: str = "--labels") -> LabelSpec:
    """``"a,b"`` / ``"a=word,b=word"`` as a :class:`LabelSpec`; :class:`UserError` names ``source``."""
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"{source} is empty; expected {SYNTAX}")
    return _spec([_item(part, source) for part in text.split(",")], source)


def as_labels(value: object, source: str = "--labels") -> LabelSpec | None:
    """A :class:`LabelSpec` from any accepted form: ``None``, a spec, the command-line string, a list of
    names (items may be ``"NAME=WORD"``) or a mapping name → word (the TOML forms)."""
    if value is None or isinstance(value, LabelSpec):
        return value
    if isinstance(value, str):
        return parse_labels(value, source)
    if isinstance(value, Mapping):
        pairs = []
        for name, word in value.items():
            if not isinstance(name, str) or not isinstance(word, str):
                raise UserError(f"{source}: a table must map class names to label words (strings); expected {SYNTAX}")
            pairs.append(_checked_pair(name, word, source))
        return _spec(pairs, source)
    if isinstance(value, Sequence) and all(isinstance(item, str) for item in value):
        return _spec([_item(item, source) for item in value], source)
    raise UserError(f"{source}: expected a list of class names or a table name = word; {SYNTAX}")


def with_template(spec: LabelSpec | None, template: str | None, source: str = "--template") -> LabelSpec | None:
    """``spec`` carrying the prompt ``template`` (unchanged when ``template`` is ``None``); a template
    needs the classes (their words end the prompt), so it is refused without them."""
    if template is None:
        return spec
    if spec is None:
        raise UserError(f"{source} needs the public classes and their words as well: {SYNTAX}")
    return replace(spec, template=template)


def with_description(spec: LabelSpec | None, description: str | None, source: str = "--describe") -> LabelSpec | None:
    """``spec`` carrying the public ``description`` (``--describe``; unchanged when ``None``), checked
    now; it needs the classes (it names one by ``{label_name}``), so it is refused without them."""
    from privlm.resources.verbalizers import description_instruction

    if description is None:
        return spec
    if spec is None:
        raise UserError(f"{source} needs the public classes as well: {SYNTAX}")
    description_instruction(description, source)
    return replace(spec, description=description)


def missing_labels_error(name: str) -> UserError:
    """The error for user data loaded without public class names."""
    return UserError(
        f"{name}: user data needs its class names as public input, never read off the private rows: pass {SYNTAX}"
    )


def unknown_label_error(where: str, spec: LabelSpec) -> UserError:
    """A row whose label is none of the public classes; ``where`` is "FILE:LINE" or "NAME row N".
    The label itself is not shown: it is private."""
    k = len(spec.names)
    return UserError(
        f"{where}: label is not one of the {k} class names given by --labels ({', '.join(spec.names)}) "
        f"nor a class index 0..{k - 1} (the value is not shown: labels are private data)"
    )


def _item(part: str, source: str) -> tuple[str, str | None]:
    name, sep, word = part.partition("=")
    return _checked_pair(name, word if sep else None, source)


def _checked_pair(name: str, word: str | None, source: str) -> tuple[str, str | None]:
    name = name.strip()
    if not name:
        raise UserError(f"{source}: empty class name; expected {SYNTAX}")
    if word is not None:
        word = word.strip()
        if not word:
            raise UserError(f"{source}: class {name!r} has an empty label word; expected {SYNTAX}")
    return name, word


def _spec(pairs: list[tuple[str, str | None]], source: str) -> LabelSpec:
    names = tuple(name for name, _ in pairs)
    if len(names) < 2:
        raise UserError(f"{source}: needs at least 2 classes, got {list(names)}; expected {SYNTAX}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UserError(f"{source}: class name {repeated[0]!r} is given twice")
    for position, name in enumerate(names):
        if _DIGITS.fullmatch(name) and int(name) != position:
            raise UserError(
                f"{source}: class name {name!r} is a number but is class {position}: a numeric name must be its "
                "own index (labels in data may be names or indices, and must mean one class)"
            )
    return LabelSpec(names, tuple(word for _, word in pairs))
