"""Hugging Face hub datasets (``hf:NAME``), for machines that are online and have ``datasets``.

``datasets`` is not a privlm dependency: without it, or offline, loading fails at once with a
:class:`UserError` that says why (with ``HF_HUB_OFFLINE=1``, ``datasets`` may serve its own cache). The hub's ``train`` split is taken as the whole corpus (privlm makes
its own splits); it needs ``text`` and ``label`` columns.

Class names are public input, never read off the rows. A ``ClassLabel`` label column carries its
class names and order in the data set's *schema*, which is public, so they are kept; ``--labels``
may override them: a permutation of the hub's names reorders the classes by name, other names rename
the hub's classes by position (the count must match). Any other label column is coded like a user
file's (:func:`privlm.resources.files.encode_labels`) and needs ``--labels``; errors name the row
(1-based), never the label.
"""

from __future__ import annotations

import importlib
import importlib.util

from huggingface_hub import constants

from privlm.errors import UserError
from privlm.resources.corpus import Corpus
from privlm.resources.files import LABEL, TEXT, encode_labels
from privlm.resources.labels import LabelSpec, missing_labels_error
from privlm.resources.online import hub_reachable


def read_hub_dataset(name: str, labels: LabelSpec | None = None) -> Corpus:
    """The ``train`` split of hub dataset ``name`` as a :class:`Corpus` with public classes (see above)."""
    if importlib.util.find_spec("datasets") is None:
        raise UserError(
            f"cannot load Hugging Face dataset {name!r}: the `datasets` package is not installed "
            "(pip install datasets; it also needs network access)"
        )
    if not (constants.HF_HUB_OFFLINE or hub_reachable()):
        raise UserError(f"cannot load Hugging Face dataset {name!r}: the hub is unreachable (offline)")
    datasets = importlib.import_module("datasets")
    try:
        table = datasets.load_dataset(name, split="train")
    except Exception as err:  # the hub raises many types (offline, unknown repo, bad config)
        raise UserError(f"cannot load Hugging Face dataset {name!r}: {err}") from err
    columns = list(table.column_names)
    for column in (TEXT, LABEL):
        if column not in columns:
            raise UserError(f"Hugging Face dataset {name!r} has no '{column}' column (columns: {', '.join(columns)})")
    source = f"hf:{name}"
    texts = [str(text) for text in table[TEXT]]
    raw = list(table[LABEL])
    where = [f"{source} row {i}" for i in range(1, len(raw) + 1)]
    hub_names = getattr(table.features[LABEL], "names", None)
    if not hub_names:
        if labels is None:
            raise missing_labels_error(source)
        return encode_labels(texts, [str(label) for label in raw], labels, where, source)
    hub_names = tuple(str(n) for n in hub_names)
    if labels is None:
        labels = LabelSpec(hub_names, (None,) * len(hub_names))
    order = _class_label_map(hub_names, labels, source)
    ids = []
    for label, place in zip(raw, where):
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(hub_names):
            raise UserError(f"{place}: ClassLabel value outside 0..{len(hub_names) - 1}")
        ids.append(order[label])
    if not ids:
        raise UserError(f"{source}: no examples")
    return Corpus(tuple(zip(texts, ids)), labels.names)


def _class_label_map(hub_names: tuple[str, ...], labels: LabelSpec, source: str) -> list[int]:
    """Our class of each hub class: by name if ``labels`` lists the hub's names, else by position."""
    if len(labels.names) != len(hub_names):
        raise UserError(
            f"{source}: --labels gives {len(labels.names)} classes but the data set's ClassLabel has "
            f"{len(hub_names)} ({', '.join(hub_names)})"
        )
    if set(labels.names) == set(hub_names):
        return [labels.names.index(name) for name in hub_names]
    if set(labels.names) & set(hub_names):
        raise UserError(
            f"{source}: --labels must either list the ClassLabel names ({', '.join(hub_names)}) in any order, "
            "or rename all of them by position"
        )
    return list(range(len(hub_names)))
