"""Config schemas: derived from the signatures of the classes and functions the configs build (DESIGN.md §6).

**One declaration per setting.** A config option names what it builds by its schema in its defaults list::

    # configs/encoder/bilstm.yaml
    defaults: [/latentstruct.models.text.BiLSTMEncoder@_here_, _self_]
    hidden: 100

The schema ``latentstruct.models.text.BiLSTMEncoder`` is a dataclass derived from that class's ``__init__``
(:func:`schema`): one field per parameter, with the parameter's type and default, and its help text from the
``Args:`` section of the class's docstring. So a setting is declared once, in the signature, and an unknown key or a
wrong type fails at composition, naming the key. A task's schema comes from its :meth:`~latentstruct.tasks.Task.build`:
its settings, and its model parts (the parameters annotated ``Part``, :mod:`latentstruct.ranges`), each a field that
holds a node of its own with a ``_target_`` (``task.estimator``, filled by the ``estimator`` group's options, whose
package is ``task.estimator``), null where the task's option chooses none. Parameters whose values come from the
data (sizes) are listed in the class attribute ``FROM_DATA`` and are not settings. Every schema that a file under
``configs/`` names is registered when this module is imported.

:func:`validate`, the first thing ``train()`` does once it holds the run directory, refuses what composition lets
through: a ``+key`` that no schema declares (a part the task does not take among them: ``+decoder=linear`` on a task
without a decoder), a part option that builds a class the task's ``Part`` does not take, a part node with settings
but no option, a value outside a ``Literal``'s choices, naming the key and the closest valid names, and a number
outside its setting's range — declared with the setting too,
``lr: Annotated[float, Positive]`` (:mod:`latentstruct.ranges`), and kept by the schema in the field's metadata.
:func:`check_command_line` runs it on the command line of ``python -m latentstruct.train`` before Hydra does anything
(an unknown key, ``+`` or not; an unknown experiment, listing them all).
``python -m latentstruct.config`` writes the option reference, ``docs/configs.md`` (:func:`reference`).

The run-level settings (``trainer``, ``paths``, ``embedding``, the optimizers) configure no class of ours and stay
dataclasses here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import inspect
import io
import itertools
import math
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any, Literal

from hydra.core.config_store import ConfigStore
from hydra.utils import get_object
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from latentstruct import compose_cache
from latentstruct.ranges import AtLeast, Constraint, NonNegative, Part, Positive, constraint_of, part_of

__all__ = ["register_configs", "run_name", "option_name", "schema", "settings", "help_texts", "validate", "ConfigError",
           "option_schemas", "experiments", "check_command_line", "CONFIG_DIR"]

#: the configs of the entry point (``python -m latentstruct.train``)
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A composed configuration that names a setting its target does not have, or a value outside its choices."""


def option_name(option: Any) -> str:
    """An enum-typed config value (OmegaConf returns the Enum member) as its plain string."""
    return str(getattr(option, "value", option))


def _help(text: str, default: Any = MISSING, allowed: Constraint | None = None, **kw) -> Any:
    """A run setting's field: its help text, its default and its range (``allowed``, :mod:`latentstruct.ranges`)."""
    metadata = {"help": text, **({"range": allowed} if allowed is not None else {})}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kw)
    return field(default=default, metadata=metadata, **kw)


# ------------------------------------------------------------------------------------- schemas from signatures
def locate(target: str) -> Any:
    """The object a ``_target_`` names (``package.module.Name``), as Hydra's ``instantiate`` finds it."""
    try:
        return get_object(target)
    except ImportError as err:
        raise ConfigError(f"cannot import {target!r}: {err}") from err


def _is_task(obj: Any) -> bool:
    """Whether ``obj`` is a task class (:class:`~latentstruct.tasks.Task`: its node's schema is its ``build``)."""
    from latentstruct.tasks.base import Task  # the tasks import torch: only when a task is met

    return isinstance(obj, type) and issubclass(obj, Task)


def _function(obj: Any) -> Any:
    """What a config node's values are passed to: a task's ``build``, a class's ``__init__``, or the function."""
    if isinstance(obj, type):
        return obj.build if _is_task(obj) else obj.__init__
    return obj


def _skipped(obj: Any) -> set[str]:
    """Parameters that are not settings: sizes from the data (``FROM_DATA``), a task's data and the top-level
    settings it shares (``latent``, ``embedding``)."""
    skip = set(getattr(obj, "FROM_DATA", ()))
    if _is_task(obj):
        skip |= {"dims", "extras", "latent", "embedding"}
    return skip


def parts(obj: Any) -> dict[str, Part]:
    """The model parts of what ``obj``'s node builds: ``{parameter: its Part}`` (a task's; none for the others)."""
    if not _is_task(obj):
        return {}
    annotated = _hints(obj, extras=True)
    return {name: found for name in settings(obj) if (found := part_of(annotated.get(name))) is not None}


def settings(obj: Any) -> dict[str, inspect.Parameter]:
    """The settings of a class or function (its configurable parameters), in signature order."""
    skip = _skipped(obj)
    params = inspect.signature(_function(obj)).parameters.values()
    return {p.name: p for p in params if p.name not in skip and p.name != "self"
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def help_texts(obj: Any) -> dict[str, str]:
    """``{parameter: help}`` from the ``Args:`` sections of the docstrings of ``obj`` (a function, or a class, its
    ``__init__`` or ``build`` and those of its latentstruct base classes): one ``name: text`` per parameter,
    continued on more deeply indented lines."""
    texts: dict[str, str] = {}
    owners = [c for c in obj.__mro__ if c.__module__.startswith("latentstruct")] if isinstance(obj, type) else [obj]
    methods = ("__init__", "build")
    docs = [d for c in owners for d in (c.__doc__ if not isinstance(c, type) else vars(c).get("__doc__"),
                                        *(getattr(vars(c).get(m), "__doc__", None) for m in methods))]
    for doc in docs:  # the first class of the MRO that documents a parameter wins
        lines = inspect.cleandoc(doc or "").splitlines()
        for i, line in enumerate(lines):
            if line.strip() != "Args:":
                continue
            indent = len(line) - len(line.lstrip())
            name, param_depth, found = None, 0, {}
            for entry in lines[i + 1:]:
                depth = len(entry) - len(entry.lstrip())
                if entry.strip() and depth <= indent:
                    break
                match = re.match(r"\s*(\w+)(?: \([^)]*\))?: ?(.*)", entry)
                if match and (name is None or depth <= param_depth):
                    name, param_depth = match.group(1), depth
                    found.setdefault(name, match.group(2).strip())
                elif name is not None and entry.strip():
                    found[name] = f"{found[name]} {entry.strip()}"
            for key, text in found.items():
                texts.setdefault(key, text)
    return texts


_SIMPLE = (int, float, bool, str)


def _field_type(annotation: Any) -> Any:
    """The OmegaConf type of a parameter's annotation: int / float / bool / str, optional, lists of those; a
    ``Literal`` is a ``str`` (its choices are checked by :func:`validate`); anything else (modules, tensors) Any."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in _SIMPLE:
        return annotation
    if origin is Literal:
        return str if all(isinstance(a, str) for a in args) else Any
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        inner = _field_type(rest[0]) if len(rest) == 1 else Any
        return Any if inner is Any else typing.Optional[inner]  # noqa: UP045  (OmegaConf reads typing.Optional)
    if origin in (list, tuple, Sequence) and args and _field_type(args[0]) in _SIMPLE:
        return list[_field_type(args[0])]
    return Any


def _choices(annotation: Any) -> tuple | None:
    """The values a ``Literal`` annotation (possibly optional) allows; None for any other annotation."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return args
    if origin in (typing.Union, types.UnionType):
        for a in args:
            if typing.get_origin(a) is Literal:
                return (*typing.get_args(a), *([None] if type(None) in args else []))
    return None


def _hints(obj: Any, extras: bool = False) -> dict[str, Any]:
    """The evaluated annotations of what ``obj``'s config node is passed to (``extras``: with ``Annotated``'s)."""
    try:
        return typing.get_type_hints(_function(obj), include_extras=extras)
    except Exception:  # an annotation that does not evaluate here (a name imported under TYPE_CHECKING): Any
        return {}


#: schemas of targets that are not ours (no signature with help texts to derive them from)
_EXTERNAL: dict[str, type] = {}


@cache
def schema(target: str) -> type:
    """The dataclass schema of ``target`` (a ``_target_`` string): ``_target_``, ``_partial_`` (true by default
    when the data gives some parameters, ``FROM_DATA``) and one field per setting, with its type, default and help."""
    if target in _EXTERNAL:
        return dataclasses.make_dataclass(_EXTERNAL[target].__name__, [("_target_", str, field(default=target))],
                                          bases=(_EXTERNAL[target],))
    obj = locate(target)
    hints, texts, annotated = _hints(obj), help_texts(obj), _hints(obj, extras=True)
    fields: list[tuple] = [("_target_", str, field(default=target))]
    if getattr(obj, "FROM_DATA", ()):
        fields.append(("_partial_", bool, field(default=True)))
    roles = parts(obj)
    for name, p in settings(obj).items():
        if name in roles:  # a model part: a node of its own (an option of the group of its name), or null
            kinds = f" ({roles[name]})" if roles[name].kinds else ""
            text = texts.get(name) or f"a model part{kinds}, chosen by {name}=<option>; null: none"
            fields.append((name, Any, field(default=None, metadata={"help": text, "part": True})))
            continue
        kind = _field_type(hints.get(name, Any))
        default = MISSING if p.default is inspect.Parameter.empty else p.default
        allowed = constraint_of(annotated.get(name))  # Annotated[float, Positive]: the range goes to the metadata
        metadata = {"help": texts.get(name, ""), **({"range": allowed} if allowed is not None else {})}
        if isinstance(default, tuple):
            default = list(default)
        if isinstance(default, (list, dict)):
            value = field(default_factory=lambda d=default: type(d)(d), metadata=metadata)
        elif not (default is None or default is MISSING or isinstance(default, _SIMPLE)):
            kind, value = Any, field(default=MISSING, metadata=metadata)
        else:
            value = field(default=default, metadata=metadata)
        fields.append((name, kind, value))
    return dataclasses.make_dataclass(target.rsplit(".", 1)[-1] + "Conf", fields)


def option_schemas(path: Path) -> list[str]:
    """The schemas a config file names: its ``/<dotted target>@<package>`` defaults entries."""
    return re.findall(r"/((?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*)@", path.read_text())


def _schema_names(config_dir: Path) -> set[str]:
    """The schemas the config files name (:func:`option_schemas` of each)."""
    return {name for path in config_dir.rglob("*.yaml") for name in option_schemas(path)}


# ------------------------------------------------------------------------------------------------- validation
def _close(name: str, options, prefix: str = "") -> str:
    """``; did you mean <prefix><option>?`` for the options closest to ``name`` (none: empty)."""
    near = difflib.get_close_matches(name, list(options), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(prefix + n for n in near)}?" if near else ""


def _optional(f: dataclasses.Field) -> bool:
    """Whether a field allows null (its type a string where its module postpones annotations)."""
    return f.default is None or (re.search(r"\bNone\b", f.type) is not None if isinstance(f.type, str)
                                 else type(None) in typing.get_args(f.type))


def _ranges(fields) -> dict[str, tuple[Constraint, bool]]:
    """``{setting: (its range, whether null is allowed)}`` of the fields of a schema that declare a range."""
    return {f.name: (f.metadata["range"], _optional(f)) for f in fields if "range" in f.metadata}


def range_text(allowed: Constraint, optional: bool) -> str:
    """What a range allows, as said by :func:`validate` and ``docs/configs.md``: ``> 0``, ``>= 1 or null``."""
    return f"{allowed}{' or null' if optional else ''}"


def _check_range(cfg: DictConfig, name: str, allowed: Constraint, optional: bool, where: str) -> None:
    """Refuse ``cfg[name]`` (each item of a list) outside ``allowed``; an interpolation is read resolved, and one
    that does not resolve here is left to the run (which reports it)."""
    node = cfg._get_node(name)
    if node is None or node._is_missing():
        return
    try:
        value = cfg[name]
    except Exception:  # noqa: BLE001  (an interpolation that only resolves in the run: ${hydra:...})
        return
    items = list(enumerate(value)) if isinstance(value, ListConfig) else [(None, value)]
    for i, item in items:
        if item is None or item in allowed:
            continue
        key = f"{where}{name}" + ("" if i is None else f".{i}")
        raise ConfigError(f"{key} = {item!r} is out of range: must be {range_text(allowed, optional)}")


def validate(cfg: DictConfig, where: str = "") -> None:
    """Refuse what composition lets through: a key that no schema declares (Hydra accepts any ``+key``), a value
    outside a parameter's choices (``Literal``) and a number outside its setting's range (:mod:`latentstruct.ranges`),
    each in one line naming the key. Every node with a ``_target_`` is checked against its target's settings; the
    dataclass nodes (``trainer``, ``paths``...) against their fields."""
    if not isinstance(cfg, DictConfig):
        return
    if not where:  # the whole configuration: what the estimator calls, the structure has (and the data fills)
        from latentstruct.capabilities import check  # it imports this module

        check(cfg)
    known: set[str] | None = None  # the keys this node may hold; None: anything
    ranges: dict[str, tuple[Constraint, bool]] = {}
    target = cfg._get_node("_target_")._value() if "_target_" in cfg else None
    if isinstance(target, str) and not target.startswith("${"):
        obj = locate(target)
        params, hints = settings(obj), _hints(obj)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(_function(obj)).parameters.values())
        known = None if takes_any else {"_target_", "_partial_", "_recursive_", "_convert_", "_args_", *params}
        for name in params:
            choices = _choices(hints.get(name))
            if choices and name in cfg and not OmegaConf.is_interpolation(cfg, name) and cfg[name] not in choices:
                raise ConfigError(f"{where}{name}={cfg[name]!r} is not one of {', '.join(map(repr, choices))} "
                                  f"({target})")
        ranges = _ranges(dataclasses.fields(schema(target)))
        for name, role in parts(obj).items():
            if name in cfg:
                _check_part(cfg, name, role, f"{where}{name}", obj)
    else:
        typed = OmegaConf.get_type(cfg)
        if dataclasses.is_dataclass(typed):
            known = {f.name for f in dataclasses.fields(typed)}
            ranges = _ranges(dataclasses.fields(typed))
    for name, (allowed, optional) in ranges.items():
        if name in cfg:
            _check_range(cfg, name, allowed, optional, where)
    for key in cfg.keys():
        if known is not None and key not in known:
            options = sorted(k for k in known if not k.startswith("_"))
            owner = where[:-1] or "the config"
            if not where and isinstance(cfg.get("task"), DictConfig) and key in cfg.task:  # the former layout
                raise ConfigError(f"unknown key '{key}': the model parts are nodes under the task, task.{key} "
                                  f"(task.{key}.<setting>=...; {key}=<option> still chooses it)")
            raise ConfigError(f"unknown key '{where}{key}'{_close(str(key), options, where)} (the keys of {owner}: "
                              f"{', '.join(options)})")
        node = cfg._get_node(key)
        if node._is_none() or node._is_missing() or node._is_interpolation():
            continue
        if isinstance(node, DictConfig):
            validate(node, f"{where}{key}.")
        elif isinstance(node, ListConfig):
            for i in range(len(node)):
                validate(node._get_node(i), f"{where}{key}.{i}.")


def _check_part(cfg: DictConfig, name: str, role: Part, key: str, task: type) -> None:
    """Refuse a task's part node ``cfg[name]`` that holds settings but no option (``_target_``: its group set to
    null under an experiment's settings), or whose option builds a class the task's :class:`Part` does not take."""
    node = cfg._get_node(name)
    if node is None or node._is_none() or node._is_missing() or node._is_interpolation():
        return
    if not isinstance(node, DictConfig) or "_target_" not in node:
        held = ", ".join(map(str, node)) if isinstance(node, DictConfig) else repr(node._value())
        raise ConfigError(f"{key} holds settings ({held}) but no option: choose one ({name}=<option>)")
    target = node._get_node("_target_")._value()
    if isinstance(target, str) and not target.startswith("${") and not role.fits(locate(target)):
        raise ConfigError(f"{key}: task {task.__name__} takes as {name} {role}, not {target}: choose another "
                          f"{name} option")


# ------------------------------------------------------------------------------------------- run settings
class LatentSource(str, Enum):
    predicted = "predicted"
    gold = "gold"
    none = "none"


class Select(str, Enum):
    last = "last"
    best = "best"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


@dataclass
class OptimConf:
    """The schema of the torch optimizers (``configs/optim/``): a partial, given the parameters by ``optim.py``."""

    _target_: str = MISSING
    _partial_: bool = True
    lr: float = _help("learning rate", 1e-3, Positive)
    weight_decay: float = _help("weight decay (decoupled for AdamW)", 0.0, NonNegative)


_EXTERNAL.update({"torch.optim.Adam": OptimConf, "torch.optim.AdamW": OptimConf, "torch.optim.SGD": OptimConf})


@dataclass
class PhaseConf:
    split: str = _help("the data split this phase trains on (e.g. labelled, train)", MISSING)
    epochs: int = _help("passes over that split", MISSING, AtLeast(1))


@dataclass
class TrainerConf:
    device: Device = _help("auto (cuda if available), cpu or cuda", "auto")
    max_steps: int | None = _help("optimizer steps; null = max_epochs × batches per epoch (or the phases' total)",
                                  None, AtLeast(1))
    max_epochs: int | None = _help("epochs, used when max_steps is null (not with phases)", None, AtLeast(1))
    phases: list[PhaseConf] = _help(
        "training phases run in order, each some epochs over a split (the semi-supervised VAE: labelled, then "
        "train); the task's begin_step(phase, step) is told where it is; empty = one phase over train", [])
    batch_size: int | None = _help("examples per step; null = the full training set", None, AtLeast(1))
    drop_last: bool = _help("skip the smaller last batch of each epoch (for tasks needing full batches: knn)", False)
    eval_every: int | None = _help("evaluate (and checkpoint) every this many steps; null = once per epoch", None,
                                   AtLeast(1))
    select: Select = _help("report the last evaluation or the best by valid/acc (among the evaluations of the last "
                           "phase of trainer.phases)", "last")
    seed: int = _help("model seed (initialisation, noise, shuffling)", 301)
    resume: bool = _help("resume from checkpoint.pt in the run directory if present", False)
    force: bool = _help("re-run even if metrics.json says completed", False)
    threads: int | None = _help(
        "torch CPU threads (intra-op) of the run: part of its configuration, as the floating-point sums depend on "
        "it; the record says the counts in force; null = torch's default (the machine's cores)", 1, AtLeast(1))
    flush_denormal: bool = _help("flush denormal floats to zero on the CPU (torch.set_flush_denormal): a relaxation's "
                                 "tiny weights (Gumbel-softmax at low τ) otherwise slow CPU arithmetic several times",
                                 False)
    progress: bool = _help("show a progress bar when stderr is a terminal; false, or output that is not a terminal: "
                           "log lines instead (trainer.log_seconds)", True)
    log_seconds: int | None = _help(
        "without the bar, log a progress line (step, epoch, loss, last valid/acc, s/100 steps, elapsed, ETA) at most "
        "every this many seconds, besides the line of every evaluation (0: every step); null = at evaluations only",
        60, NonNegative)
    log_every: int = _help("send the training loss to the logger every this many steps", 100, AtLeast(1))
    checkpoint_every: int | None = _help(
        "also checkpoint every this many steps (besides every evaluation); null = at evaluations only", None,
        AtLeast(1))
    checkpoint_seconds: int | None = _help(
        "also checkpoint when this many seconds have passed since the last checkpoint (0: every step); null = never "
        "by time", 600,
        NonNegative)
    keep_checkpoint: bool = _help(
        "keep checkpoint.pt once the run completes (what resuming it for more steps, and the tree drawings, read); "
        "false: remove it then", True)
    init_from: str | None = _help(
        "a completed run's directory whose final checkpoint this run starts from (weights, optimizer moments, step, "
        "history, random state), then trains on under its own configuration (its learning rates, to its own "
        "length): a fork, e.g. an ablation of a later phase; the source's fingerprint and step join this run's "
        "identity (trainer.forked_from), its path does not; null = from scratch", None)


@dataclass
class EmbeddingConf:
    pretrained: str | None = _help(
        "GloVe text file (plain or compressed; relative to paths.data_dir unless absolute) whose vectors initialise "
        "the word embeddings; null = trainable N(0, 1) embeddings of size `dim`", None)
    dim: int = _help("embedding size without a pretrained file (that file's own size otherwise)", 300, AtLeast(1))
    freeze: bool = _help("keep pretrained vectors fixed (as in the papers)", True)
    lowercase: bool = _help("lower-case every token before building the vocabulary (for uncased GloVe 6B)", False)
    cache_dir: str = _help("where the vocabulary-filtered GloVe matrices are cached", ".cache/glove")


@dataclass
class PathsConf:
    data_dir: str = _help("root of the real datasets", "${oc.env:LATENTSTRUCT_DATA,data}")
    output_dir: str = _help("this run's directory (Hydra's)", "${hydra:runtime.output_dir}")
    multirun_dir: str = _help("root of the sweeps' deterministic directories", "multirun")


@dataclass
class TrainConf:
    dataset: Any = MISSING
    optim: Any = MISSING
    trainer: TrainerConf = field(default_factory=TrainerConf)
    logger: Any = MISSING
    paths: PathsConf = field(default_factory=PathsConf)
    embedding: EmbeddingConf = field(default_factory=EmbeddingConf)
    task: Any = MISSING  # one nested node: the task's settings and its model parts (task.encoder, task.estimator...)
    optim_groups: dict[str, OptimConf] = _help(
        "optimizers for the task's named parameter groups (e.g. sigma), overriding `optim` for those parameters", {}
    )
    latent: LatentSource = _help("what the decoder is fed: predicted (estimator), gold (oracle) or none", "predicted")
    tuned: dict[str, Any] = _help("tuned hyper-parameters an experiment interpolates from (per setting)", {})


def run_name(overrides: str) -> str:
    """A run directory's name from its overrides as Hydra joins them (``hydra.job.override_dirname``: sorted,
    without the settings that cannot change a result): ``+experiment=sst_spigot,task.estimator.eta=0.1``; ``default``
    for none. A ``/`` in a value becomes ``%``; a name over 200 characters keeps its first 180 and a hash of all."""
    name = overrides.replace("/", "%") or "default"
    if len(name) > 200:
        name = f"{name[:180]}...{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    return name


def register_configs(config_dir: Path = CONFIG_DIR) -> None:
    """Register the run schema, the schemas the config files name, and the resolvers."""
    # ``${k:${dataset.num_clusters}}`` -> "k10": a string key into a per-setting ``tuned`` table (an interpolated
    # key segment must be a string, and a bare integer cannot be one).
    OmegaConf.register_new_resolver("k", lambda value: f"k{value}", replace=True)
    # ``${len:${trainer.phases}}``: the number of training phases, for a task whose training depends on it
    OmegaConf.register_new_resolver("len", len, replace=True)
    # ``${run_name:${hydra.job.override_dirname}}``: a run's directory name (configs/train.yaml)
    OmegaConf.register_new_resolver("run_name", run_name, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="base_train", node=TrainConf)
    for name in sorted(_schema_names(config_dir)):
        cs.store(name=name, node=schema(name))


register_configs()
compose_cache.install()  # Hydra's composition without its fixed costs; the same result


# ----------------------------------------------------------------------------------------------- command line
def experiments(config_dir: Path = CONFIG_DIR) -> dict[str, list[str]]:
    """The experiments (``+experiment=<name>``, ``configs/experiment/<name>.yaml``) by family, the first word of
    their names (``sst_spigot``: ``sst``)."""
    families: dict[str, list[str]] = {}
    for path in sorted((config_dir / "experiment").glob("*.yaml")):
        families.setdefault(path.stem.split("_")[0], []).append(path.stem)
    return families


def _unknown_experiment(name: str, config_dir: Path) -> str:
    families = experiments(config_dir)
    known = [e for names in families.values() for e in names]
    width = max(map(len, families))
    lines = [f"unknown experiment '{name}'{_close(name, known)}", "the experiments (+experiment=<name>), by family:"]
    lines += [f"  {family:<{width}}  {', '.join(names)}" for family, names in families.items()]
    lines.append("Each one's file, configs/experiment/<name>.yaml, says what it runs; every option: "
                 "python -m latentstruct.train --help, docs/configs.md.")
    return "\n".join(lines)


def check_command_line(args: list[str], config_dir: Path = CONFIG_DIR) -> list[str]:
    """The arguments of ``python -m latentstruct.train``, checked before Hydra reads them.

    Returns them (a copy). Raises :class:`ConfigError` for an unknown experiment, listing every experiment, and for
    whatever :func:`validate` refuses in the configuration composed from the overrides: an unknown key —
    ``trainer.max_step=10`` as much as ``+trainer.max_step=10``, where Hydra suggests the ``+`` for the first and lets
    the second through — a value outside its choices or a number outside its range. A sweep (``-m``) is checked job by
    job: each combination of its experiments' and options' values is composed (beyond :data:`MAX_COMPOSED` combinations,
    each value once with the others' first), and in each every value of every swept key is validated in turn, set as its
    override sets it — so ``-m optim.lr=1e-3,-1e-3`` is refused before its first job runs. A sweep config's own
    ``hydra.sweeper.params`` (``+sweep=listops_chart``: its experiments) join the command line's sweeps where the
    command line does not set their key, as Hydra's sweeper joins them. Anything else (an unknown option of a group, a
    value of the wrong type, a malformed override or flag) is left to Hydra, which reports it as it always does.
    """
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser  # Hydra's own reading of its command line
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    known = {e for names in experiments(config_dir).values() for e in names}
    args = list(args)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            flags = get_args_parser().parse_args(args)
        overrides = OverridesParser.create().parse_overrides(flags.overrides)
    except (SystemExit, HydraException):  # --version, or a malformed command line: Hydra answers it
        return args
    if flags.help or flags.hydra_help or flags.info or flags.shell_completion or flags.experimental_rerun or (
            flags.config_path or flags.config_name or flags.config_dir):
        return args
    # every key override as ++key (added if unknown, for validate); each job's overrides: ``fixed``, one combination
    # of the group sweeps' values (``grid``) and the key sweeps' (``swept``: checked one value at a time)
    fixed: list[str] = []
    grid: list[list[str]] = []
    swept: list[tuple[str, list[str]]] = []
    parse = OverridesParser.create().parse_override
    for o in overrides:
        if not _classify(o, known, config_dir, fixed, grid, swept):
            return args  # glob, interval: the sweeper's to enumerate
    # a sweep config's own sweeper params (+sweep=listops_chart: its experiments), where the command line does not set
    # the key: without them a setting of a part that an experiment chooses looks like a part with no option
    if any(o.key_or_group == "sweep" for o in overrides):
        given = {o.key_or_group for o in overrides}
        try:
            with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
                params = compose("train", overrides=fixed, return_hydra_config=True).hydra.sweeper.params or {}
            for key, value in params.items():
                o = parse(f"{key}={value}")
                if o.key_or_group not in given and not _classify(o, known, config_dir, fixed, grid, swept):
                    return args
        except ConfigError:
            raise
        except Exception:  # noqa: BLE001  (a sweep that does not compose: Hydra composes it again and reports it)
            return args
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            for combination in _sweep_jobs(grid):
                cfg = compose("train", overrides=[*fixed, *combination, *(items[0] for _, items in swept)])
                validate(cfg)
                for key, items in swept:  # each other value in turn, set as its override sets it
                    for item in items[1:]:
                        OmegaConf.update(cfg, key, parse(item).value(), merge=False, force_add=True)
                        validate(cfg)
                    OmegaConf.update(cfg, key, parse(items[0]).value(), merge=False, force_add=True)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001  (a job that does not compose: Hydra composes it again and reports it)
        unread = _unread_part(err)
        if unread:
            raise ConfigError(unread) from None
        return args
    return args


def _classify(o, known: set[str], config_dir: Path, fixed: list[str], grid: list[list[str]],
              swept: list[tuple[str, list[str]]]) -> bool:
    """Put the parsed override ``o`` of :func:`check_command_line` into ``fixed``, ``grid`` or ``swept``; an unknown
    experiment raises :class:`ConfigError`. False for a sweep only the sweeper enumerates (glob, interval)."""
    from hydra.core.override_parser.types import OverrideType, ValueType

    if o.is_sweep_override() and o.value_type not in (ValueType.SIMPLE_CHOICE_SWEEP, ValueType.CHOICE_SWEEP,
                                                      ValueType.RANGE_SWEEP):
        return False
    values = o.sweep_string_iterator() if o.is_sweep_override() else iter([o.get_value_element_as_str()])
    if o.key_or_group == "experiment" and o.type is not OverrideType.DEL:
        values = list(values)
        for name in values:
            if name not in known and name != "null":
                raise ConfigError(_unknown_experiment(name, config_dir))
        values = iter(values)
    if o.type is OverrideType.DEL:
        fixed.append(o.input_line)
        return True
    group = o.package is not None or "/" in o.key_or_group or (config_dir / o.key_or_group).is_dir()
    key = o.get_key_element()
    if o.type is OverrideType.CHANGE and not group and not o.key_or_group.startswith("hydra"):
        key = f"++{key}"
    items = [f"{key}={value}" for value in values]
    if len(items) == 1:
        fixed.append(items[0])
    elif group or o.key_or_group.startswith("hydra"):
        grid.append(items)
    else:
        swept.append((o.key_or_group, items))
    return True


def _unread_part(err: BaseException) -> str | None:
    """What to say of a composition that failed on a part the task does not take (``+decoder=linear`` on a task
    without a decoder: its option's package, ``task.decoder``, is not a field of the task's schema); None for any other
    failure."""
    from omegaconf.errors import ConfigKeyError

    seen: BaseException | None = err
    while seen is not None:
        key, owner = getattr(seen, "full_key", None), getattr(seen, "object_type", None)
        if isinstance(seen, ConfigKeyError) and isinstance(key, str) and key.count(".") == 1 and (
                key.startswith("task.") and dataclasses.is_dataclass(owner)) and (
                taken := [f.name for f in dataclasses.fields(owner) if f.metadata.get("part")]):
            name = key.split(".")[1]
            task = owner.__name__.removesuffix("Conf")
            return (f"task {task} takes no {name} (its parts: {', '.join(taken) or 'none'}): remove the {name} "
                    f"override")
        seen = seen.__cause__ or seen.__context__
    return None


#: the most compositions that :func:`check_command_line` makes of a sweep's group values (0.2 s each)
MAX_COMPOSED = 16


def _sweep_jobs(grid: list[list[str]]) -> list[tuple[str, ...]]:
    """The combinations of the group sweeps' values that :func:`check_command_line` composes: all of them, or
    beyond :data:`MAX_COMPOSED` the first values and each other value of each sweep with the others' first."""
    if math.prod(map(len, grid)) <= MAX_COMPOSED:
        return list(itertools.product(*grid))
    first = tuple(items[0] for items in grid)
    return [first] + [first[:i] + (item,) + first[i + 1:] for i, items in enumerate(grid) for item in items[1:]]


# -------------------------------------------------------------------------------------------------- reference
def _cell(value: Any) -> str:
    text = "required" if value is MISSING else "null" if value is None else str(value).lower() if isinstance(
        value, bool) else str(value)
    return f"`{text}`".replace("|", "\\|")


def _rows(fields, values: dict, prefix: str = "") -> list[str]:
    """A table row per setting: its full key (``prefix`` + name, e.g. ``task.estimator.eta``), value and help."""
    rows = []
    for f in fields:
        if f.name.startswith("_") or f.name in ("defaults",):
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        value = values.get(f.name, default)
        text = " ".join(str(f.metadata.get("help", "")).split()).replace("|", "\\|")
        if "range" in f.metadata:
            text += f" (range: `{range_text(f.metadata['range'], _optional(f))}`)"
        rows.append(f"| `{prefix}{f.name}` | {_cell(value)} | {text} |")
    return rows


def _field_helps(node: DictConfig) -> dict[str, str]:
    """The help text of each setting of a config node: its ``_target_``'s schema, or its dataclass's fields."""
    target = node._get_node("_target_")._value() if "_target_" in node else None
    if isinstance(target, str) and not target.startswith("${"):
        try:
            fields = dataclasses.fields(schema(target))
        except ConfigError:
            return {}
    else:
        typed = OmegaConf.get_type(node)
        fields = dataclasses.fields(typed) if dataclasses.is_dataclass(typed) else ()
    return {f.name: " ".join(str(f.metadata.get("help", "")).split()) for f in fields if f.metadata.get("help")}


def annotated(cfg: DictConfig, indent: str = "") -> list[str]:
    """The configuration as YAML lines, each setting followed by its help text as a comment (``--help``)."""
    import yaml

    lines, helps = [], _field_helps(cfg)
    for key in cfg.keys():
        node = cfg._get_node(key)
        if isinstance(node, DictConfig) and not node._is_none() and not node._is_interpolation() and len(node):
            lines += [f"{indent}{key}:", *annotated(node, indent + "  ")]
            continue
        raw = node._value() if not isinstance(node, (DictConfig, ListConfig)) else OmegaConf.to_container(
            node, resolve=False)
        value = yaml.safe_dump(getattr(raw, "value", raw), default_flow_style=True, width=10_000).strip()
        value = value.removesuffix("\n...").removesuffix("...").strip()
        comment = f"  # {helps[key]}" if key in helps else ""
        lines.append(f"{indent}{key}: {value}{comment}")
    return lines


def help_page(args: list[str], config_dir: Path = CONFIG_DIR) -> str:
    """``python -m latentstruct.train [overrides] --help``: the groups and their options, then every setting of the
    configuration the overrides compose, with its full key's value and its help text."""
    from hydra import compose, initialize_config_dir

    overrides = [a for a in args if a not in ("--help", "-h") and not a.startswith("-")]
    groups = sorted(p.name for p in config_dir.iterdir() if p.is_dir())
    lines = ["usage: python -m latentstruct.train [group=option ...] [key=value ...] [-m for a sweep]", "",
             "Every setting below can be given as its full key (task.estimator.eta=0.1); docs/configs.md lists every "
             "option of every group, and what each experiment sets. --hydra-help: Hydra's own flags.", "",
             "== Groups (group=option) ==", ""]
    lines += [f"{g}: {', '.join(sorted(p.stem for p in (config_dir / g).glob('*.yaml')))}" for g in groups]
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    lines += ["", f"== Settings of {' '.join(overrides) or 'the default experiment'} (key: value  # help) ==", ""]
    return "\n".join(lines + annotated(cfg)) + "\n"


def experiment_delta(name: str, config_dir: Path = CONFIG_DIR) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``+experiment=<name>`` changes, read from its file and the ``/common_*`` files it includes (in order,
    later ones winning): the options it chooses (``{group: option}``) and the settings it gives (``{full key:
    value}``)."""
    import yaml  # the experiment files as written, not composed: fast, and exactly the delta

    groups: dict[str, Any] = {}
    values: dict[str, Any] = {}

    def read(path: Path) -> None:
        raw = yaml.safe_load(path.read_text()) or {}
        for entry in raw.get("defaults") or []:
            if isinstance(entry, str) and entry.startswith("/") and entry != "_self_":
                read(config_dir / f"{entry.lstrip('/')}.yaml")
            elif isinstance(entry, dict):
                for key, option in entry.items():
                    groups[key.removeprefix("override ").lstrip("/")] = option
        values.update(flatten_values({k: v for k, v in raw.items() if k != "defaults"}))

    read(config_dir / "experiment" / f"{name}.yaml")
    return groups, values


def flatten_values(tree: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and empty dicts are values)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten_values(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def reference(config_dir: Path = CONFIG_DIR) -> str:
    """The option reference (``docs/configs.md``): the experiments, then every option of every group, what it builds
    and each of its settings with its value in that option and its help text, all read from the schemas."""
    import yaml  # only the reference reads the option files directly

    out = ["# Config reference", "",
           "Generated from the schemas (the `Args:` sections of the signatures the options build) by "
           "`python -m latentstruct.config > docs/configs.md`; `tests/test_config.py` checks that it is current. "
           "A value shown is the option's own where it sets one, else the signature's default. A setting's range, "
           "where it has one, is checked when the configuration is composed (`latentstruct/ranges.py`).", ""]
    out += ["## Experiments", "", "`+experiment=<name>`, by family; the header of `configs/experiment/<name>.yaml` "
            "says what each one runs.", ""]
    families = experiments(config_dir)
    out += [f"- **{family}**: {', '.join(f'`{e}`' for e in names)}" for family, names in families.items()] + [""]
    out += ["### What each experiment sets", "",
            "The options it chooses and the settings it gives (its file and the `common_*.yaml` it includes, later "
            "ones winning): what differs from the defaults of `configs/train.yaml` and of the options chosen. "
            "`python -m latentstruct.train +experiment=<name> --cfg job` prints the whole composed configuration.", "",
            "| experiment | options | settings |", "| --- | --- | --- |"]
    for names in families.values():
        for name in names:
            groups, values = experiment_delta(name, config_dir)
            chosen = ", ".join(f"`{g}={_cell(v).strip('`')}`" for g, v in groups.items())
            given = ", ".join(f"`{k}={_cell(v).strip('`')}`" for k, v in values.items())
            out.append(f"| `{name}` | {chosen or '—'} | {given or '—'} |")
    out.append("")
    run = [("trainer", TrainerConf), ("paths", PathsConf), ("embedding", EmbeddingConf), ("optim_groups.<name>",
           OptimConf)]
    out += ["## Run settings", "", "| setting | default | help |", "| --- | --- | --- |"]
    out += _rows([f for f in dataclasses.fields(TrainConf) if f.name in ("latent", "tuned")], {})
    for name, conf in run:
        out += [f"| **{name}** | | |"] + _rows(dataclasses.fields(conf), {}, f"{name}.")
    groups = sorted({p.parent.relative_to(config_dir).as_posix() for p in config_dir.rglob("*.yaml")
                     if p.parent != config_dir} - {"experiment", "sweep", "preset"}, key=str)
    for group in groups:
        if group.split("/")[0] in ("experiment", "sweep", "preset", "hydra", "trainer", "paths"):
            continue
        out += ["", f"## `{group}`", ""]
        for path in sorted((config_dir / group).glob("*.yaml")):
            raw = yaml.safe_load(path.read_text()) or {}
            names = option_schemas(path)
            if not names:
                continue
            values = raw.get("task", {}) if group == "task" else raw
            if group == "task":  # its parts: the options its defaults choose (null: none)
                values = {**values, **{k.lstrip("/"): v for entry in raw.get("defaults") or []
                                       if isinstance(entry, dict) for k, v in entry.items()}}
            text = path.read_text()
            comment = " ".join(line[1:].strip() for line in text.splitlines()
                               if line.startswith("#") and "@package" not in line)
            package = re.match(r"# @package (\S+)", text)  # a part's options: task.<group>
            prefix = f"{package.group(1)}." if package and package.group(1) != "_global_" else f"{group}."
            out += [f"### `{group}={path.stem}` → `{names[0]}`", ""] + ([comment, ""] if comment else [])
            rows = _rows(dataclasses.fields(schema(names[0])), values, prefix.replace("/", "."))
            out += (["| setting | value | help |", "| --- | --- | --- |", *rows] if rows else ["(no settings)"]) + [""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(reference(), end="")
