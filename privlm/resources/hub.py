"""Hugging Face hub datasets (``hf:NAME``), for machines that are online and have ``datasets``.

``datasets`` is not a privlm dependency: without it, or offline, loading fails at once with a
:class:`UserError` that says why (with ``HF_HUB_OFFLINE=1``, ``datasets`` may serve its own cache). The hub's ``train`` split is taken as the whole corpus (privlm makes
its own splits); it needs ``text`` and ``label`` columns. A ``ClassLabel`` label column keeps its
class names and order; any other label column is coded like a user file's
(:func:`privlm.resources.files.encode_labels`).
"""

from __future__ import annotations

import importlib
import importlib.util

from huggingface_hub import constants

from privlm.errors import UserError
from privlm.resources.corpus import Corpus, checked
from privlm.resources.files import LABEL, TEXT, encode_labels
from privlm.resources.online import hub_reachable


def read_hub_dataset(name: str) -> Corpus:
    """The ``train`` split of hub dataset ``name`` as a :class:`Corpus`."""
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
    texts = [str(text) for text in table[TEXT]]
    labels = list(table[LABEL])
    feature = table.features[LABEL]
    names = getattr(feature, "names", None)
    if names:
        return checked(Corpus(tuple(zip(texts, labels)), tuple(names)), f"hf:{name}")
    return encode_labels(texts, [str(label) for label in labels], f"hf:{name}", list(range(len(labels))))
