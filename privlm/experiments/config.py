"""Experiment configuration (TOML) and its grid of cells: methods × ε × n per class × seeds.

Example (``research/synthetic_pool50/config.toml``)::

    model = "smollm2-135m"
    dataset = "rotten-tomatoes"  # or "jsonl:PATH" / "csv:PATH" with labels = [...] (below)
    pool_per_class = 50          # the private pool, drawn once from the train split ("all": the whole split)
    n_per_class = [5, 10, 20]
    seeds = [0, 1, 2]
    test_size = 500              # seeded subset of the test split (omit: all of it)
    validation_size = 100        # best epoch chosen on this validation subset (omit: last epoch)
    delta = 1e-5

    [finetune]                   # a preset of privlm.lm.finetune, plus overrides
    preset = "smollm2"

    [methods.gradmm]
    epsilons = ["none", 1.0, 0.05]   # "none": no DP
    preset = "demo"
    [methods.random]
    [methods.full-pool]              # ignores n_per_class: trains on the whole pool
    [methods."gradmm@top50"]         # NAME@VARIANT: method NAME again, with other parameters (ablations)
    top_k = 50
    n_per_class = [5, 10]            # optional: this method's own sizes instead of the grid's

User data (``jsonl:``, ``csv:``, ``hf:`` without a ClassLabel column) needs its public class names,
as ``privlm … --labels`` does: ``labels = ["negative", "positive"]`` (items may be ``"NAME=WORD"``) or
``labels = {negative = "bad", positive = "great"}`` (name = label word, in class order). They are never
read off the private rows (see :mod:`privlm.resources.labels`); for a built-in data set they may only
repeat its names. ``describe = "{label_name} movie review sentence"`` is the public description generation
methods write from (as ``--describe``). ``template = "Note: {text} Diagnosis:"`` sets the prompt of user data (as
``--template``). Explicit splits, as ``--train/--validation/--test``: ``train = "train.jsonl"``,
``test = "test.jsonl"`` (each file is that split, whole; ``dataset`` may then be left out, and gives
the splits that are not files). ``head_probe = true`` (or a ``[head_probe]`` table: ``epochs``, ``lr``,
``batch_size``, ``max_length``) scores every cell's set a second way, beside the fine-tune: the head-only
classifier of :mod:`privlm.training.head_probe` (a shared setting: it is in the shared hash). A
configuration without ``labels``, ``template``, split files or ``head_probe`` hashes as it did before those
keys existed.

The configuration hash (SHA-256 of its canonical JSON) tags every results row, and so do two finer
hashes: of the shared settings, and of the shared settings plus one method's parameters. A resume keeps
every row whose method hash still holds (adding seeds, sizes, ε values or methods keeps the finished
cells), reruns the cells of a method whose parameters changed, and refuses rows whose shared settings differ.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from privlm.digest import digest
from privlm.errors import UserError
from privlm.lm.finetune_config import FinetuneConfig, preset
from privlm.privacy.validation import check_epsilon
from privlm.resources.datasets import DataSpec, data_spec
from privlm.resources.labels import LabelSpec, as_labels, with_description, with_template
from privlm.synthesis.registry import base_name  # noqa: F401  (re-exported: the report reads it from here)
from privlm.training.head_probe_config import HeadProbeConfig

NO_DP = "none"
FULL_POOL = "full-pool"
WHOLE_SPLIT = "all"  # pool_per_class = "all": the whole train split is the private pool
_METHOD_NAME = re.compile(r"[A-Za-z0-9_-]+(@[A-Za-z0-9._-]+)?")


CELL_INDEPENDENT = ("hash", "methods", "n_per_class", "seeds")  # a cell's result does not depend on these lists


def shared_hash(config: dict[str, Any]) -> str:
    """Hash of a configuration's shared settings (model, data, pool, splits, fine-tuning, δ, ...), from its
    dict form (``ExperimentConfig.to_dict()`` or a saved ``config.json``): not the grid's lists."""
    return digest({k: v for k, v in config.items() if k not in CELL_INDEPENDENT})


def method_hash(config: dict[str, Any], name: str) -> str:
    """Hash of what method ``name``'s cells depend on: the shared settings and the method's parameters
    (not its list of ε values: each cell has its own ε)."""
    spec = next(m for m in config["methods"] if m["name"] == name)
    return digest({"shared": shared_hash(config), "name": name, "params": spec["params"]})


@dataclass(frozen=True)
class MethodSpec:
    """One method of the grid: its name, ε values (``None``: no DP / not applicable), parameters, and its
    own sizes ``n_per_class`` (``None``: the grid's; e.g. a slow method run to smaller n only)."""

    name: str
    epsilons: tuple[float | None, ...] = (None,)
    params: dict[str, Any] = field(default_factory=dict)
    sizes: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Cell:
    """One fine-tune-and-score run of the grid."""

    method: str
    n_per_class: int
    seed: int
    epsilon: float | None

    @property
    def key(self) -> str:
        """Stable identifier, also the file name of the cell's cached training set (``n = 0``: the whole pool)."""
        eps = NO_DP if self.epsilon is None else f"{self.epsilon:g}"
        return f"{self.method}_n{self.n_per_class or WHOLE_SPLIT}_seed{self.seed}_eps{eps}"


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything that determines the results (see module docstring for the TOML form)."""

    model: str
    dataset: str | None
    pool_per_class: int | str  # or WHOLE_SPLIT
    n_per_class: tuple[int, ...]
    seeds: tuple[int, ...]
    methods: tuple[MethodSpec, ...]
    finetune: dict[str, Any] = field(default_factory=lambda: {"preset": "smollm2"})
    delta: float = 1e-5
    test_size: int | None = None
    validation_size: int | None = None
    data_seed: int = 0
    mia: bool = True
    labels: LabelSpec | None = None
    train: str | None = None
    validation: str | None = None
    test: str | None = None
    head_probe: dict[str, Any] | None = None

    def data_spec(self) -> str | DataSpec:
        """Where the splits come from (:func:`privlm.resources.datasets.data_spec`)."""
        return data_spec(self.dataset, self.train, self.validation, self.test)

    def to_dict(self) -> dict[str, Any]:
        """Canonical dict form; ``labels``, a template and split files only when given (older
        configurations keep their hashes)."""
        data = asdict(self)
        for key in ("labels", "train", "validation", "test", "head_probe"):
            if data[key] is None:
                del data[key]
        for key in ("template", "description"):
            if self.labels is not None and getattr(self.labels, key) is None:
                del data["labels"][key]
        for method in data["methods"]:  # older configurations keep their hashes
            if method["sizes"] is None:
                del method["sizes"]
        return data

    @property
    def hash(self) -> str:
        """SHA-256 (first 16 hex digits) of the canonical JSON form."""
        return digest(self.to_dict())

    @property
    def shared_hash(self) -> str:
        """Hash of the settings every cell shares (see :func:`shared_hash`)."""
        return shared_hash(self.to_dict())

    def method_hash(self, name: str) -> str:
        """Hash of what one method's cells depend on (see :func:`method_hash`)."""
        return method_hash(self.to_dict(), name)

    def finetune_config(self, seed: int) -> FinetuneConfig:
        """The fine-tuning preset with this config's overrides and the cell's seed."""
        overrides = {k: v for k, v in self.finetune.items() if k not in ("preset", "grid")}
        return preset(self.finetune.get("preset", "smollm2"), **overrides, seed=seed)

    def head_probe_config(self) -> HeadProbeConfig | None:
        """The head-only downstream classifier's settings (``[head_probe]``), or None when it is not run."""
        return None if self.head_probe is None else HeadProbeConfig(**self.head_probe)

    def finetune_grid(self, seed: int) -> list[FinetuneConfig]:
        """``[finetune] grid = [{lr = ...}, ...]``: candidates chosen on validation (empty: no grid)."""
        base = self.finetune_config(seed)
        return [replace(base, **entry) for entry in self.finetune.get("grid", [])]

    def cells(self) -> list[Cell]:
        """The grid in run order: method, ε, n, seed (``full-pool`` uses ``n = pool_per_class`` once, ``n = 0``
        for the whole train split)."""
        grid = []
        whole = 0 if self.pool_per_class == WHOLE_SPLIT else self.pool_per_class
        for method in self.methods:
            sizes = (whole,) if base_name(method.name) == FULL_POOL else method.sizes or self.n_per_class
            for eps in method.epsilons:
                for n in sizes:
                    grid.extend(Cell(method.name, n, seed, eps) for seed in self.seeds)
        return grid


def _epsilon(value: Any, where: str) -> float | None:
    if value == NO_DP:
        return None
    if isinstance(value, bool):
        raise UserError(f"{where}: epsilon must be a positive finite number or {NO_DP!r}, got {value!r}")
    return check_epsilon(value, f"{where}: epsilon")


def _int_list(value: Any, where: str) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise UserError(f"{where} must be a non-empty list of integers, got {value!r}")
    return tuple(value)


def _head_probe(value: Any, source: str) -> dict[str, Any] | None:
    """``head_probe = true`` (the defaults) or a ``[head_probe]`` table of :class:`HeadProbeConfig` fields;
    checked here so that a bad value stops the run before the first cell."""
    if value is None or value is False:
        return None
    table = {} if value is True else value
    if not isinstance(table, dict):
        raise UserError(f"{source}: head_probe must be true or a table, got {value!r}")
    known = {f.name for f in fields(HeadProbeConfig)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise UserError(f"{source}: head_probe: unknown key(s) {unknown}; known: {sorted(known)}")
    try:
        HeadProbeConfig(**table)
    except UserError as err:
        raise UserError(f"{source}: {err}") from err
    return dict(table)


def parse_config(data: dict[str, Any], source: str) -> ExperimentConfig:
    """Validate a parsed TOML document; errors name ``source`` and the key."""
    known = {f.name for f in fields(ExperimentConfig)} | {"template", "describe"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(f"{source}: unknown key(s) {unknown}; known: {sorted(known)}")
    for key in ("model", "dataset", "pool_per_class", "n_per_class", "seeds", "methods"):
        if key not in data and not (key == "dataset" and "train" in data):  # a train file may stand for it
            raise UserError(f"{source}: missing key {key!r}")
    splits = {
        key: None if data.get(key) is None else str(data[key]) for key in ("dataset", "train", "validation", "test")
    }
    if not isinstance(data["methods"], dict) or not data["methods"]:
        raise UserError(f"{source}: [methods] must name at least one method table")
    methods = []
    for name, table in data["methods"].items():
        if not _METHOD_NAME.fullmatch(name):
            raise UserError(
                f"{source}: method table name {name!r} must be NAME or NAME@VARIANT "
                "(letters, digits, '_', '-'; the variant may also hold '.'): it names files"
            )
        params = dict(table)
        epsilons = params.pop("epsilons", [NO_DP])
        if not isinstance(epsilons, list) or not epsilons:
            raise UserError(f"{source}: methods.{name}.epsilons must be a non-empty list")
        sizes = params.pop("n_per_class", None)
        methods.append(
            MethodSpec(
                name,
                tuple(_epsilon(e, f"{source}: methods.{name}") for e in epsilons),
                params,
                None if sizes is None else _int_list(sizes, f"{source}: methods.{name}.n_per_class"),
            )
        )
    n_per_class = _int_list(data["n_per_class"], f"{source}: n_per_class")
    n_per_class_all = [*n_per_class, *(n for m in methods for n in m.sizes or ())]
    pool = data["pool_per_class"]
    if pool == WHOLE_SPLIT:
        if data.get("mia", True):
            raise UserError(
                f"{source}: pool_per_class = {WHOLE_SPLIT!r} leaves no train examples as membership non-members; "
                "set mia = false"
            )
    elif isinstance(pool, bool) or not isinstance(pool, int) or pool < max(n_per_class_all):
        raise UserError(
            f"{source}: pool_per_class must be an integer >= every n_per_class or {WHOLE_SPLIT!r}, got {pool!r}"
        )
    if min(n_per_class_all) < 1:
        raise UserError(f"{source}: n_per_class values must be >= 1")
    for key in ("test_size", "validation_size"):
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UserError(f"{source}: {key} must be a positive integer, got {value!r}")
    delta = data.get("delta", 1e-5)
    if not 0 < delta < 1:
        raise UserError(f"{source}: delta must be in (0, 1), got {delta!r}")
    config = ExperimentConfig(
        model=str(data["model"]),
        dataset=splits["dataset"],
        pool_per_class=pool,
        n_per_class=n_per_class,
        seeds=_int_list(data["seeds"], f"{source}: seeds"),
        methods=tuple(methods),
        finetune=dict(data.get("finetune", {"preset": "smollm2"})),
        delta=float(delta),
        test_size=data.get("test_size"),
        validation_size=data.get("validation_size"),
        data_seed=int(data.get("data_seed", 0)),
        mia=bool(data.get("mia", True)),
        labels=with_description(
            with_template(
                as_labels(data.get("labels"), f"{source}: labels"), data.get("template"), f"{source}: template"
            ),
            data.get("describe"),
            f"{source}: describe",
        ),
        train=splits["train"],
        validation=splits["validation"],
        test=splits["test"],
        head_probe=_head_probe(data.get("head_probe"), source),
    )
    if config.labels is None and config.dataset is not None and config.dataset.startswith(("jsonl:", "csv:")):
        raise UserError(
            f"{source}: dataset {config.dataset!r} is user data: give its public class names, e.g. "
            'labels = ["negative", "positive"] or labels = {negative = "bad", positive = "great"} '
            "(never read off the private rows)"
        )
    grid = config.finetune.get("grid", [])
    if not isinstance(grid, list) or not all(isinstance(entry, dict) for entry in grid):
        raise UserError(f"{source}: finetune.grid must be a list of tables, e.g. [{{lr = 1e-5}}, {{lr = 5e-5}}]")
    if grid and config.validation_size is None:
        raise UserError(f"{source}: finetune.grid needs validation_size (selection is on validation, never on test)")
    try:
        config.finetune_grid(0)
    except TypeError as err:
        raise UserError(f"{source}: bad [finetune] table ({err})") from err
    return config


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate a TOML experiment file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"experiment config {path} does not exist")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid TOML ({err})") from err
    return parse_config(data, str(path))
