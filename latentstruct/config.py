"""Config schemas: derived from the signatures of the classes and functions the configs build (DESIGN.md §6).

**One declaration per setting.** A config option names what it builds by its schema in its defaults list::

    # configs/encoder/bilstm.yaml
    defaults: [/latentstruct.models.text.BiLSTMEncoder@_here_, _self_]
    hidden: 100

The schema ``latentstruct.models.text.BiLSTMEncoder`` is a dataclass derived from that class's ``__init__``
(:func:`schema`): one field per parameter, with the parameter's type and default, and its help text from the
``Args:`` section of the class's docstring. So a setting is declared once, in the signature, and an unknown key or a
wrong type fails at composition, naming the key. A task's schema comes from its :meth:`~latentstruct.tasks.Task.build`
(the model parts it is built from are config groups of their own, not fields). Parameters whose values come from the
data (sizes) are listed in the class attribute ``FROM_DATA`` and are not settings. Every schema that a file under
``configs/`` names is registered when this module is imported.

The run-level settings (``trainer``, ``paths``, ``embedding``, the optimizers) configure no class of ours and stay
dataclasses here.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any, Literal

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

__all__ = ["register_configs", "option_name", "schema", "settings", "help_texts", "validate", "ConfigError",
           "CONFIG_DIR"]

#: the configs of the entry point (``python -m latentstruct.train``)
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A composed configuration that names a setting its target does not have, or a value outside its choices."""


def option_name(option: Any) -> str:
    """An enum-typed config value (OmegaConf returns the Enum member) as its plain string."""
    return str(getattr(option, "value", option))


def _help(text: str, default: Any = MISSING, **kw) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": text}, **kw)
    return field(default=default, metadata={"help": text}, **kw)


# ------------------------------------------------------------------------------------- schemas from signatures
def locate(target: str) -> Any:
    """The object a ``_target_`` names (``package.module.Name`` or ``package.module.Class.attribute``)."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ConfigError(f"cannot import {target!r}")


def _function(obj: Any) -> Any:
    """What a config node's values are passed to: a task's ``build``, a class's ``__init__``, or the function."""
    if isinstance(obj, type):
        return obj.build if hasattr(obj, "PARTS") else obj.__init__
    return obj


def _skipped(obj: Any) -> set[str]:
    """Parameters that are not settings: sizes from the data (``FROM_DATA``), a task's data and parts."""
    skip = set(getattr(obj, "FROM_DATA", ()))
    if isinstance(obj, type) and hasattr(obj, "PARTS"):
        skip |= {"dims", "extras", "latent", "embedding", *obj.PARTS}
    return skip


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
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        inner = _field_type(rest[0]) if len(rest) == 1 else Any
        return Any if inner is Any else typing.Optional[inner]  # noqa: UP045  (OmegaConf reads typing.Optional)
    if origin in (list, tuple, Sequence) and args and _field_type(args[0]) in _SIMPLE:
        return list[_field_type(args[0])]
    return Any


def _choices(annotation: Any) -> tuple | None:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return args
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        for a in args:
            if typing.get_origin(a) is Literal:
                return (*typing.get_args(a), *([None] if type(None) in args else []))
    return None


def _hints(obj: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(_function(obj))
    except Exception:  # an annotation that does not evaluate here (a name imported under TYPE_CHECKING): Any
        return {}


@cache
def schema(target: str) -> type:
    """The dataclass schema of ``target`` (a ``_target_`` string): ``_target_``, ``_partial_`` (true by default
    when the data gives some parameters, ``FROM_DATA``) and one field per setting, with its type, default and help."""
    obj = locate(target)
    hints, texts = _hints(obj), help_texts(obj)
    fields: list[tuple] = [("_target_", str, field(default=target))]
    if getattr(obj, "FROM_DATA", ()):
        fields.append(("_partial_", bool, field(default=True)))
    for name, p in settings(obj).items():
        kind = _field_type(hints.get(name, Any))
        default = MISSING if p.default is inspect.Parameter.empty else p.default
        if isinstance(default, tuple):
            default = list(default)
        if isinstance(default, (list, dict)):
            value = field(default_factory=lambda d=default: type(d)(d), metadata={"help": texts.get(name, "")})
        elif not (default is None or default is MISSING or isinstance(default, _SIMPLE)):
            kind, value = Any, field(default=MISSING, metadata={"help": texts.get(name, "")})
        else:
            value = field(default=default, metadata={"help": texts.get(name, "")})
        fields.append((name, kind, value))
    return dataclasses.make_dataclass(target.rsplit(".", 1)[-1] + "Conf", fields)


def _schema_names(config_dir: Path) -> set[str]:
    """The schemas the config files name: ``/<dotted target>@<package>`` entries of their defaults lists."""
    names = set()
    for path in config_dir.rglob("*.yaml"):
        names.update(re.findall(r"/((?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*)@", path.read_text()))
    return names


# ------------------------------------------------------------------------------------------------- validation
def _close(name: str, options) -> str:
    near = difflib.get_close_matches(name, list(options), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(near)}?" if near else ""


def validate(cfg: DictConfig, where: str = "") -> None:
    """Refuse what composition lets through: a key that no schema declares (Hydra accepts any ``+key``), and a
    value outside a parameter's choices (``Literal``). Every node with a ``_target_`` is checked against its
    target's settings; the dataclass nodes (``trainer``, ``paths``...) against their fields."""
    if not isinstance(cfg, DictConfig):
        return
    known: set[str] | None = None  # the keys this node may hold; None: anything
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
    else:
        typed = OmegaConf.get_type(cfg)
        if dataclasses.is_dataclass(typed):
            known = {f.name for f in dataclasses.fields(typed)}
    for key in cfg.keys():
        if known is not None and key not in known:
            options = sorted(k for k in known if not k.startswith("_"))
            owner = where[:-1] or "the config"
            raise ConfigError(f"unknown setting {where}{key}{_close(str(key), options)} (the settings of {owner}: "
                              f"{', '.join(options)})")
        node = cfg._get_node(key)
        if node._is_none() or node._is_missing() or node._is_interpolation():
            continue
        if isinstance(node, DictConfig):
            validate(node, f"{where}{key}.")
        elif isinstance(node, ListConfig):
            for i in range(len(node)):
                validate(node._get_node(i), f"{where}{key}.{i}.")


# ------------------------------------------------------------ legacy schemas (moving into the signatures)
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


class SortingBaseline(str, Enum):
    none = "none"
    gumbel_sinkhorn = "gumbel_sinkhorn"


class KNNBaseline(str, Enum):
    none = "none"
    neuralsort = "neuralsort"
    neuralsort_stochastic = "neuralsort_stochastic"


class ListOpsMethod(str, Enum):
    lstm = "lstm"
    chart = "chart"
    gumbel_tree = "gumbel_tree"
    reinforce = "reinforce"
    ppo = "ppo"


class ListOpsBaseline(str, Enum):
    none = "none"
    moving_average = "moving_average"
    self_critical = "self_critical"


class VAEMethod(str, Enum):
    direct = "direct"
    gsm = "gsm"


class VAETheta(str, Enum):
    likelihood = "likelihood"
    elbo = "elbo"


#: seed 004's training procedures (latentstruct.tasks.energy.METHODS); the sequence task adds the exact CRF
_ENERGY_METHODS = ("mbce", "implicit", "explicit", "infnet", "spen")
EnergyMethod = Enum("EnergyMethod", [(m, m) for m in _ENERGY_METHODS], type=str)
SequenceEnergyMethod = Enum("SequenceEnergyMethod", [(m, m) for m in (*_ENERGY_METHODS, "crf")], type=str)


class EnergyPrimary(str, Enum):
    ssvm = "ssvm"
    cd = "cd"
    dvn = "dvn"


class InnerOptimizer(str, Enum):
    sgd = "sgd"
    adam = "adam"


# ---------------------------------------------------------------------------------------------------- dataset
@dataclass
class SyntheticClustersConf:
    _target_: str = "latentstruct.data.synthetic.synthetic_clusters"
    num_features: int = _help("input dimension D", 100)
    num_clusters: int = _help("number of clusters K (also the latent size)", 3)
    n_train: int = _help("training examples", 5000)
    n_valid: int = _help("validation examples", 1000)
    n_test: int = _help("test examples", 1000)
    noise: float = _help("σ of the isotropic noise around each centre", 0.1)
    seed: int = _help("data seed: centres, cluster models and samples", 42)
    data_dir: str | None = _help("unused (generated data)", None)


@dataclass
class SortingNumbersConf:
    _target_: str = "latentstruct.data.sorting.sorting_numbers"
    num_items: int = _help("d, the length of each sequence (the matching is d × d)", 10)
    n_train: int = _help("training sequences (seed 002's released code: 10, one full batch)", 10)
    n_valid: int = _help("validation sequences (best-validation selection stands in for early stopping)", 200)
    n_test: int = _help("test sequences (the paper: a single one per repetition; we report means over many)", 1000)
    seed: int = _help("data seed: every split's numbers", 42)
    data_dir: str | None = _help("unused (generated data)", None)


@dataclass
class ImageClassificationConf:
    _target_: str = "latentstruct.data.images.image_classification"
    name: str = _help("mnist, fashion_mnist or cifar10 (read from <data_dir>/<name>/, see latentstruct/data/images.py)",
                      MISSING)
    n_valid: int = _help("training images held out for validation", 5000)
    seed: int = _help("seed of the validation hold-out", 0)
    subset: int | None = _help("keep only this many training images (reduced runs); null = all", None)
    data_dir: str = _help("root of the real datasets", "${paths.data_dir}")


@dataclass
class SemiSupervisedConf:
    _target_: str = "latentstruct.data.semisupervised.semisupervised_dataset"
    name: str = _help("mnist or fashion_mnist (IDX files read from <data_dir>/<name>/)", MISSING)
    n_labelled: int = _help("labelled training images, the same number per class (seed 003: 50 ... 1200)", 100)
    label_seed: int = _help("seed of the balanced labelled subset", "${trainer.seed}")
    n_valid: int = _help("the last training images held out for validation", 10000)
    data_dir: str = _help("root of the real datasets", "${paths.data_dir}")


@dataclass
class _TextDatasetConf:
    data_dir: str = _help("root of the real datasets", "${paths.data_dir}")
    pretrained: str | None = _help("set through embedding.pretrained", "${embedding.pretrained}")
    lowercase: bool = _help("set through embedding.lowercase", "${embedding.lowercase}")
    cache_dir: str = _help("set through embedding.cache_dir", "${embedding.cache_dir}")
    subset: int | None = _help("keep this many training examples, drawn by a fixed seed (smoke runs); null = all",
                               None)
    eval_subset: int | None = _help("keep this many valid / test examples, drawn likewise; null = all", None)


@dataclass
class ListOpsConf:
    _target_: str = "latentstruct.data.listops.listops_dataset"
    data_dir: str = _help("root of the real datasets (holds <folder>/test_d20s.tsv[.gz], the official test set)",
                          "${paths.data_dir}")
    folder: str = _help("the ListOps folder, relative to data_dir", "listops")
    n_train: int = _help("generated training expressions before the length filter (Havrylov et al. 2019: 90k)",
                         90000)
    n_valid: int = _help("generated expressions held out for validation (issue #7: 1000)", 1000)
    seed: int = _help("generator and split seed (issue #7: 42)", 42)
    max_train_tokens: int = _help("drop training expressions with more leaves (Havrylov et al. 2019: 130)", 130)
    subset: int | None = _help("keep the first this many training expressions (smoke runs); null = all", None)
    max_eval_tokens: int | None = _help("keep only valid / test expressions with at most this many leaves (reduced "
                                        "runs; null = all, the official protocol)", None)


@dataclass
class MLCConf:
    _target_: str = "latentstruct.data.mlc.mlc_dataset"
    name: str = _help("bibtex, delicious, eurlex, bookmarks, or any <name> read from <data_dir>/<name>/: "
                      "<name>-train.arff + <name>-test.arff (or <name>.arff) and <name>.xml (data/mlc.py)",
                      MISSING)
    data_dir: str = _help("root of the real datasets", "${paths.data_dir}")
    seed: int = _help("seed of the fixed re-split permutation (the same split for every run)", 0)
    sizes: list[int] | None = _help("train / valid / test sizes adding up to the labelled examples; null = seed 004's "
                                    "Table 6 (bibtex, delicious, eurlex; bookmarks has none)", None)
    folder: str | None = _help("the dataset folder, relative to data_dir unless absolute; null = <name>", None)
    drop_empty: bool = _help("drop the examples without any label before splitting (gives the paper's sizes)", True)


@dataclass
class CoNLLConf(_TextDatasetConf):
    _target_: str = "latentstruct.data.conll.conll_dataset"
    folder: str = _help("the CoNLL-2003 folder (train/valid/test.txt[.gz], 4 columns: token POS chunk NER), relative "
                        "to data_dir unless absolute", "conll2003")
    scheme: str = _help("tagging scheme of the model's tags: bioes (17 tags) or iob2 (9); the files are IOB2", "bioes")
    features: bool = _help("also give the POS and chunk columns as per-token ids (seed 004's NER+)", False)
    min_count: int = _help("words seen fewer times in train map to <unk>", 1)
    repair_tags: bool = _help("read ill-formed IOB2 (or IOB1 files) as conlleval does instead of refusing it", False)


@dataclass
class TwPOSConf(_TextDatasetConf):
    _target_: str = "latentstruct.data.twpos.twpos_dataset"
    folder: str = _help("the Twitter POS folder (oct27.{train,dev,test}, daily547.conll; token<TAB>tag, plain or .gz), "
                        "relative to data_dir unless absolute", "twpos")
    min_count: int = _help("words seen fewer times in train map to <unk>", 1)
    check_sizes: bool = _help("refuse files whose tweet counts are not the v0.3 release's 1327 / 500 / 547", True)


# ------------------------------------------------------------------------------------------------------ task
@dataclass
class TaskConf:
    _target_: str = _help("the task class; train.py builds it with <class>.from_config(cfg, dims, extras)")


@dataclass
class SortingConf(TaskConf):
    _target_: str = "latentstruct.tasks.Sorting"
    hidden: int = _help("units of the μ-network's hidden layer (seed 002 App. C.1, Mena et al. 2018: 32)", 32)
    learn_sigma: bool = _help("learn σ per sequence with a σ-network Linear(d → 1) → softplus (needs estimator=direct)",
                              False)
    baseline: SortingBaseline = _help(
        "none: train through the configured estimator; gumbel_sinkhorn: Mena et al. (2018) instead", "none"
    )
    tau: float = _help("gumbel_sinkhorn: Sinkhorn temperature τ", 1.0)
    sinkhorn_iters: int = _help("gumbel_sinkhorn: Sinkhorn normalisation rounds", 10)
    samples: int = _help("gumbel_sinkhorn: Gumbel noise samples per sequence", 5)


@dataclass
class KNNConf(TaskConf):
    _target_: str = "latentstruct.tasks.KNN"
    k: int = _help("neighbours (seed 002 Table 3: 1, 3, 5, 9)", MISSING)
    num_queries: int = _help("queries per batch; the rest of trainer.batch_size are the candidates", 100)
    embedding: str = _help("embedding network: mnist_convnet or resnet18 (latentstruct/models/vision.py)",
                           "mnist_convnet")
    learn_sigma: bool = _help("learn σ per query with the σ-network (needs estimator=direct)", False)
    sigma_net: str = _help("σ-network: mnist_convnet or cifar_convnet", "mnist_convnet")
    baseline: KNNBaseline = _help(
        "none: train through the configured estimator; neuralsort / neuralsort_stochastic: Grover et al. (2019)",
        "none")
    tau: float = _help("NeuralSort temperature τ", 16.0)
    samples: int = _help("neuralsort_stochastic: Plackett-Luce samples per query", 5)


@dataclass
class ListOpsTaskConf(TaskConf):
    _target_: str = "latentstruct.tasks.ListOps"
    method: ListOpsMethod = _help("lstm (baseline), chart (structure=binary_tree × estimator), gumbel_tree (Choi et "
                                  "al. 2018), reinforce (score function), ppo (Havrylov et al. 2019)", "lstm")
    word_dim: int = _help("word vectors (Havrylov et al. 2019: 128)", 128)
    hidden: int = _help("LSTM / Tree-LSTM / merge-parser states (Havrylov et al. 2019: 128)", 128)
    mlp_hidden: int = _help("hidden layer of the classifier MLP", 128)
    dropout: float = _help("dropout before the classifier MLP's layers", 0.0)
    scorer_hidden: int = _help("chart: the span scorer's BiLSTM, both directions together", 128)
    span_hidden: int = _help("chart: the span MLP's tanh layer (memory [B, n, n, span_hidden])", 128)
    checkpoint: bool = _help("chart: recompute the ChartTreeLSTM per width in backward (O(B n² dim) memory, not "
                             "O(B n³ dim))", False)
    disjoint: bool = _help("the parser gets its own embeddings and (reinforce, ppo) a separate composer Tree-LSTM, "
                           "as Havrylov et al. (2019); not for gumbel_tree", False)
    tau: float = _help("gumbel_tree: Gumbel-softmax temperature", 1.0)
    baseline: ListOpsBaseline = _help("reinforce / ppo control variate: none, moving_average or self_critical",
                                      "moving_average")
    decay: float = _help("decay of the moving-average baseline", 0.9)
    entropy_weight: float = _help("reinforce / ppo: weight of the entropy bonus (sum of per-merge entropies)", 0.0)
    normalize_advantage: bool = _help("reinforce / ppo: divide the advantage by max(1, its running std)", False)
    norm_decay: float = _help("decay of the advantage's running variance", 0.9)
    ppo_clip: float = _help("ppo: clip ε of the probability ratio (Havrylov et al. 2019: 0.2)", 0.2)
    ppo_refresh: int = _help("ppo: training steps between refreshes of the behaviour policy (the PPO updates per "
                             "sample; Havrylov et al. 2019: 15 per batch)", 15)
    eval_max_cells: int = _help("evaluation batches (sorted by length) hold at most this many examples × n²",
                                1048576)


@dataclass
class VAETaskConf(TaskConf):
    _target_: str = "latentstruct.tasks.SemiSupervisedVAE"
    method: VAEMethod = _help("direct (optimisation through argmax, seed 003) or gsm (Gumbel-softmax)", "direct")
    gaussian_dim: int = _help("dimension of each component's Gaussian code", 30)
    encoder_hidden: list[int] = _help("the shared encoder's two hidden layers", [400, 200])
    head_hidden: int = _help("hidden layer of the discrete head", 100)
    decoder_hidden: int = _help("hidden layer of the decoder", 400)
    negative_slope: float = _help("LeakyReLU slope", 0.2)
    theta: VAETheta = _help("direct: component scores of the loss-perturbed argmax, the decoder's log-likelihood or "
                            "the ELBO terms (log-likelihood minus the component's Gaussian KL)", "likelihood")
    labelled_epsilon: float = _help("direct: ε in the labelled phase", 0.05)
    anneal_start: float = _help("ε (direct) / τ (gsm) at the start of the unsupervised phase; gsm's labelled τ", 1.0)
    anneal_rate: float = _help("ε / τ = max(start · exp(−rate · t), floor), t = unsupervised steps", 1e-5)
    anneal_floor: float = _help("lower bound of the annealed ε / τ", 0.1)
    gsm_label_weight: float = _help("gsm: weight of the labelled cross-entropy on the relaxed sample", 10.0)
    gsm_hard: bool = _help("gsm: straight-through (one-hot forward, relaxed gradient)", False)
    kl_discrete: bool = _help("train on KL(q(z|x) ‖ uniform), as the seed's objective does; false: as the authors' "
                              "direct code did, only report it", True)


@dataclass
class MLCEnergyTaskConf(TaskConf):
    _target_: str = "latentstruct.tasks.MultiLabelEnergy"
    method: EnergyMethod = _help("mbce (the MLP A alone), implicit (seed 004 Algorithm 1), explicit (the same loop, φ "
                                 "with ∂L_prim/∂φ only), infnet (Tu & Gimpel 2018, eq. 5), spen (Belanger & McCallum "
                                 "2016, SSVM)", "implicit")
    primary: EnergyPrimary = _help("implicit / explicit: the primary loss L_prim, ssvm, cd or dvn", "cd")
    feature_hidden: list[int] = _help("the energy's feature MLP F, also the shape of A and F (seed 004 / SPEN: "
                                      "150-150; 250-250 for delicious)", [150, 150])
    global_hidden: int = _help("units of the global energy term vᵀ softplus(Cy + c) (16; 10 for delicious)", 16)
    lam: float = _help("λ of eq. 6 (L_aux = L_MLE + λ E(x, A(x))) and of eq. 5 (infnet); our choice", 1.0)
    inner_steps: int = _help("T_inner: inner steps on θ per batch (Algorithm 1); our choice", 1)
    inner_optimizer: InnerOptimizer = _help("the inference networks' optimizer (inner steps, pretraining, InfNet "
                                            "ascent): sgd (Algorithm 1's plain steps) or adam", "adam")
    inner_lr: float = _help("its learning rate; our choice", 1e-3)
    neumann_terms: int = _help("implicit: terms of the von Neumann series for H⁻¹ (Appendix A; not given); our "
                               "choice: on bibtex 20 terms reach ~2/3 of the series' limit", 20)
    neumann_alpha: float = _help("implicit: its step α (Lorraine et al. 2020; not given); our choice: α λ_max ≈ 0.6 "
                                 "for H's largest eigenvalue measured on bibtex (~125); the series diverges when "
                                 "α λ_max > 2", 5e-3)
    num_samples: int = _help("cd: K negatives drawn from A(x) (not given by the seed); our choice", 10)
    straight_through: bool = _help("cd: straight-through gradient of the samples to θ (without it ∂L_CD/∂θ = 0 and "
                                   "implicit = explicit; the seed does not say)", True)
    infnet_ce: float = _help("infnet: weight of the inference networks' MBCE in their ascent (InfNet+'s +CE)", 0.0)
    spen_steps: int = _help("spen: projected gradient steps of (loss-augmented) inference; our choice", 10)
    spen_lr: float = _help("spen: their step size; our choice", 0.1)


@dataclass
class NEREnergyTaskConf(TaskConf):
    _target_: str = "latentstruct.tasks.SequenceLabelEnergy"
    method: SequenceEnergyMethod = _help(
        "mbce (the BiLSTM baseline: A alone, token cross-entropy), implicit (seed 004 Algorithm 1), explicit (φ with "
        "∂L_prim/∂φ only), infnet (Tu & Gimpel 2018, eq. 5; + infnet_ce: InfNet+), spen (SSVM, projected gradient "
        "on the simplices), crf (the BiLSTM-CRF, exact: NLL by the forward algorithm, Viterbi)", "implicit")
    primary: EnergyPrimary = _help("implicit / explicit: the primary loss L_prim, ssvm, cd or dvn", "cd")
    hidden: int = _help("BiLSTM units per direction of every feature network (the issue / Tu & Gimpel 2018: 100); "
                        "word vectors: embedding.dim (100 in the experiments)", 100)
    feature_dim: int = _help("NER+ (dataset.features=true): size of the POS and of the chunk embeddings; our choice",
                             20)
    dropout: float = _help("dropout on the BiLSTM outputs; our choice", 0.0)
    normalize_cost: bool = _help("Δ = token Hamming loss divided by the length (false: the number of wrong tags, on "
                                 "the scale of the energy, a sum over tokens)", False)
    lam: float = _help("λ of eq. 6 and eq. 5; our choice (as for MLC)", 1.0)
    inner_steps: int = _help("T_inner (Algorithm 1); our choice (as for MLC)", 1)
    inner_optimizer: InnerOptimizer = _help("the inference networks' optimizer (inner steps, pretraining, InfNet "
                                            "ascent): sgd or adam", "adam")
    inner_lr: float = _help("its learning rate; our choice (as for MLC)", 1e-3)
    neumann_terms: int = _help("implicit: terms of the von Neumann series for H⁻¹; our choice (as for MLC)", 20)
    neumann_alpha: float = _help("implicit: its step α (as for MLC); the series diverges when α λ_max(H) > 2: "
                                 "λ_max ≤ 215 measured on CoNLL (configs/task/ner_energy.yaml)", 5e-3)
    num_samples: int = _help("cd: K sequences drawn per sentence from A(x); our choice (as for MLC)", 10)
    straight_through: bool = _help("cd: straight-through gradient of the samples to θ (needed for an implicit term)",
                                   True)
    infnet_ce: float = _help("infnet: weight of the inference networks' token cross-entropy in their ascent "
                             "(InfNet+)", 0.0)
    spen_steps: int = _help("spen: projected gradient steps of (loss-augmented) inference; our choice", 10)
    spen_lr: float = _help("spen: their step size; our choice", 0.1)


# ---------------------------------------------------------------------------------------------- optim etc.
@dataclass
class OptimConf:
    _target_: str = MISSING
    _partial_: bool = True
    lr: float = _help("learning rate", 1e-3)
    weight_decay: float = _help("weight decay (decoupled for AdamW)", 0.0)


@dataclass
class PhaseConf:
    split: str = _help("the data split this phase trains on (e.g. labelled, train)", MISSING)
    epochs: int = _help("passes over that split", MISSING)


@dataclass
class TrainerConf:
    device: Device = _help("auto (cuda if available), cpu or cuda", "auto")
    max_steps: int | None = _help("optimizer steps; null = max_epochs × batches per epoch (or the phases' total)",
                                  None)
    max_epochs: int | None = _help("epochs, used when max_steps is null (not with phases)", None)
    phases: list[PhaseConf] = _help(
        "training phases run in order, each some epochs over a split (the semi-supervised VAE: labelled, then "
        "train); the task's begin_step(phase, step) is told where it is; empty = one phase over train", [])
    batch_size: int | None = _help("examples per step; null = the full training set", None)
    drop_last: bool = _help("skip the smaller last batch of each epoch (for tasks needing full batches: knn)", False)
    eval_every: int | None = _help("evaluate (and checkpoint) every this many steps; null = once per epoch", None)
    select: Select = _help("report the last evaluation or the best by valid/acc (among the evaluations of the last "
                           "phase of trainer.phases)", "last")
    seed: int = _help("model seed (initialisation, noise, shuffling)", 301)
    resume: bool = _help("resume from checkpoint.pt in the run directory if present", False)
    force: bool = _help("re-run even if metrics.json says completed", False)
    threads: int | None = _help("torch CPU threads; null = torch's default", None)
    progress: bool = _help("show a progress bar", True)
    log_every: int = _help("send the training loss to the logger every this many steps", 100)


@dataclass
class LoggerConf:
    _target_: str = MISSING


@dataclass
class WandbLoggerConf(LoggerConf):
    project: str = _help("wandb project", "latentstruct")
    mode: str = _help("offline (default: never touches the network), online or disabled", "offline")


@dataclass
class EmbeddingConf:
    pretrained: str | None = _help(
        "GloVe text file (plain or compressed; relative to paths.data_dir unless absolute) whose vectors initialise "
        "the word embeddings; null = trainable N(0, 1) embeddings of size `dim`", None)
    dim: int = _help("embedding size without a pretrained file (that file's own size otherwise)", 300)
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
    # the model parts (latentstruct.tasks.base.PART_GROUPS): the task's option selects those it is built from
    encoder: Any = None
    scorer: Any = None
    structure: Any = None
    estimator: Any = None
    decoder: Any = None
    optim: Any = MISSING
    trainer: TrainerConf = field(default_factory=TrainerConf)
    logger: Any = MISSING
    paths: PathsConf = field(default_factory=PathsConf)
    embedding: EmbeddingConf = field(default_factory=EmbeddingConf)
    task: Any = MISSING
    optim_groups: dict[str, OptimConf] = _help(
        "optimizers for the task's named parameter groups (e.g. sigma), overriding `optim` for those parameters", {}
    )
    latent: LatentSource = _help("what the decoder is fed: predicted (estimator), gold (oracle) or none", "predicted")
    tuned: dict[str, Any] = _help("tuned hyper-parameters an experiment interpolates from (per setting)", {})


_SCHEMAS = {
    ("dataset", "base_synthetic_clusters"): SyntheticClustersConf,
    ("dataset", "base_sorting_numbers"): SortingNumbersConf,
    ("dataset", "base_image_classification"): ImageClassificationConf,
    ("dataset", "base_semisupervised"): SemiSupervisedConf,
    ("dataset", "base_listops"): ListOpsConf,
    ("dataset", "base_mlc"): MLCConf,
    ("dataset", "base_conll"): CoNLLConf,
    ("dataset", "base_twpos"): TwPOSConf,
    ("task", "base_task"): TaskConf,
    ("task", "base_sorting"): SortingConf,
    ("task", "base_knn"): KNNConf,
    ("task", "base_vae"): VAETaskConf,
    ("task", "base_listops"): ListOpsTaskConf,
    ("task", "base_mlc_energy"): MLCEnergyTaskConf,
    ("task", "base_ner_energy"): NEREnergyTaskConf,
    ("optim", "base_optim"): OptimConf,
    ("trainer", "base_trainer"): TrainerConf,
    ("logger", "base_logger"): LoggerConf,
    ("logger", "base_wandb"): WandbLoggerConf,
    ("paths", "base_paths"): PathsConf,
}


def register_configs(config_dir: Path = CONFIG_DIR) -> None:
    """Register the run schema, the schemas the config files name, and the resolvers."""
    # ``${k:${dataset.num_clusters}}`` -> "k10": a string key into a per-setting ``tuned`` table (an interpolated
    # key segment must be a string, and a bare integer cannot be one).
    OmegaConf.register_new_resolver("k", lambda value: f"k{value}", replace=True)
    cs = ConfigStore.instance()
    cs.store(name="base_train", node=TrainConf)
    for (group, name), node in _SCHEMAS.items():
        cs.store(group=group, name=name, node=node)
    for name in sorted(_schema_names(config_dir)):
        cs.store(name=name, node=schema(name))


register_configs()
