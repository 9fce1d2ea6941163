"""The device bundle: what a GPU machine that already has PyTorch lacks to run latentstruct, in one git-ignored folder.

    python scripts/bundle.py build [--out .device] [--data DIR | --no-data]    # make device-bundle (here, online)
    python scripts/bundle.py install [--bundle .device] [--bench-target DIR]   # there (scripts/gpu_check.sh, ...)
    python scripts/bundle.py venv DIR                                           # a venv that sees the GPU image only

The GPU machines this project is lent run Python 3.12 with PyTorch (CUDA), numpy, scipy, pandas, scikit-learn,
matplotlib, pyyaml, tqdm, joblib, pytest, hypothesis, ... — :data:`GPU_IMAGE`, the image's package list as the device
tool documents it — and reach no package registry. ``build`` works out which of latentstruct's requirements (with the
``sweep`` and ``slurm`` extras: the launchers), and which of theirs, that image lacks, and fetches each at the version
installed in this interpreter (the one the tests here ran with) into ``<out>/wheels``: hydra-core, omegaconf,
antlr4-python3-runtime, entmax, hydra-joblib-launcher, hydra-submitit-launcher and submitit, all pure-Python
``py3-none-any`` wheels that serve this machine's Python and the device's alike. A package published without a wheel
(antlr4-python3-runtime 4.9.3) is built into one here; a package whose wheel is not pure is fetched twice, for this
interpreter and for CPython 3.12 manylinux x86-64. ``wandb`` (``logger=wandb``) is an optional extra, not bundled.
``<out>/bench`` holds the reference libraries of ``bench/structures.py`` (SuPar, torch-struct and what they import
that the image lacks), never installed beside latentstruct. ``<out>/data`` copies the datasets the experiments read
from the data root (``$LATENTSTRUCT_DATA``): every folder of :data:`DATASETS`, about 17 MiB in all, well within the
64 MiB a device call carries with the working tree (``bundle.json`` lists every file, its size and what was left out).
``<out>/commit.txt`` stamps the commit (``<sha>`` or ``<sha>+dirty``) for run records written where there is no git.

``install`` puts latentstruct into the interpreter that runs it, from the bundle alone: ``pip install --no-index
--find-links <bundle>/wheels --no-build-isolation -e '<project>[sweep,slurm]'`` with every pip setting of the machine
turned off, so pip's resolver proves that the bundle plus what the interpreter already has satisfy every requirement,
or names the one missing. ``venv`` makes the interpreter the tests install into: a fresh venv whose only packages are
symbolic links to this interpreter's copies of the GPU image's packages and of what they require (a ``.pth`` file
points at the folder of links), so nothing else installed here — hydra, omegaconf, entmax — can stand in for the
bundle.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import venv as venv_module
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: the Python packages of the GPU machines' image ('cuda', read on 2026-11-17), as the device tool lists them
GPU_IMAGE = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp
""".split())

#: latentstruct's extras the GPU runs need: the joblib launcher (several runs at once), the submitit launcher
EXTRAS = ("sweep", "slurm")
#: bench/structures.py's reference libraries (the Makefile's BENCH_DEPS pins) and what they import beyond the image
BENCH = ("supar==1.1.4", "torch-struct==0.5", "nltk", "dill")
#: the data-root folders some experiment reads, and what reads them; the data root's other folders stay behind
DATASETS = {
    "sst": "SST trees (spigot Table 3)",
    "snli": "SNLI dev and test only: without the training split the SNLI table stays blocked",
    "glove": "the GloVe subsets (embedding.pretrained)",
    "conll2003": "CoNLL-2003 NER (energy Table 3)",
    "twpos": "Twitter POS (energy Table 9)",
    "bibtex": "multi-label bibtex (energy Tables 1, 5)",
    "delicious": "multi-label delicious (energy Tables 1, 5)",
    "mnist": "MNIST (direct k-NN and VAE)",
    "listops": "the ListOps test split (training expressions are generated)",
    "cora": "Cora citations (energy Table 4)",
}
#: what a device call carries with the working tree, in all
CARRY_LIMIT = 64 * 2**20
MANIFEST = "bundle.json"
STAMP = "commit.txt"


class BundleError(RuntimeError):
    """The bundle cannot be built or installed; the message says why in one line."""


def normalize(name: str) -> str:
    """A distribution's name as package indexes compare them (PEP 503): ``Hydra_Core`` -> ``hydra-core``."""
    return re.sub(r"[-_.]+", "-", name).lower()


# --------------------------------------------------------------------------------------------- what to bundle


def _pyproject_requirements(extras: tuple[str, ...]) -> list[str]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise BundleError("reading pyproject.toml needs Python >= 3.11 (tomllib)") from None

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *(r for e in extras for r in project["optional-dependencies"][e])]


def _requires(dist: metadata.Distribution, extras: set[str]) -> list:
    """The requirements of an installed distribution that apply here, with the given extras."""
    from packaging.requirements import Requirement

    out = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
            out.append(req)
    return out


def plan(extras: tuple[str, ...] = EXTRAS) -> tuple[dict[str, str], dict[str, str | None]]:
    """What the bundle holds and what the GPU image provides: ``({name: version installed here}, {name: version
    here or None})``, over latentstruct's requirements (with ``extras``) and, for those not in the image, theirs."""
    from packaging.requirements import Requirement

    bundle: dict[str, str] = {}
    image: dict[str, str | None] = {}
    todo = [Requirement(r) for r in _pyproject_requirements(extras)]
    while todo:
        req = todo.pop()
        name = normalize(req.name)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if name in GPU_IMAGE:
            image.setdefault(name, _version(name))
            continue
        if name in bundle:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise BundleError(f"{name} is required but not installed in {sys.executable}: run make install") from None
        bundle[name] = dist.version
        todo += _requires(dist, set(req.extras))
    return dict(sorted(bundle.items())), dict(sorted(image.items()))


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------- fetching wheels


def _pip(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, cwd=cwd)


def _wheel_name(path: Path) -> tuple[str, str]:
    """``hydra_core-1.3.8-py3-none-any.whl`` -> ``("hydra-core", "1.3.8")``."""
    name, version = path.name.split("-")[:2]
    return normalize(name), version


def _is_pure(path: Path) -> bool:
    return path.name.endswith("-none-any.whl")


def fetch(name: str, version: str | None, dest: Path, log=print) -> list[Path]:
    """The wheel(s) of ``name==version`` in ``dest`` (reused when already there): a pure wheel from the index, else
    one built here from the sdist, else binary wheels for this interpreter and for CPython 3.12 on x86-64 Linux."""
    dest.mkdir(parents=True, exist_ok=True)
    have = [p for p in dest.glob("*.whl") if _wheel_name(p)[0] == normalize(name)
            and (version is None or _wheel_name(p)[1] == version)]
    if have:
        return have
    spec = f"{name}=={version}" if version else name
    with tempfile.TemporaryDirectory(prefix="bundle-") as tmp:
        tmp = Path(tmp)
        pure = _pip("download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                    "py", "--abi", "none", "--platform", "any", "-d", str(tmp / "pure"), spec)
        found = list((tmp / "pure").glob("*.whl")) if pure.returncode == 0 else []
        if not found:  # no pure wheel published: build one from the source distribution
            source = _pip("download", "--no-deps", "--no-binary=:all:", "-d", str(tmp / "src"), spec)
            if source.returncode == 0:
                sdist = next((tmp / "src").iterdir())
                built = _pip("wheel", "--no-deps", "-w", str(tmp / "built"), str(sdist))
                found = [p for p in (tmp / "built").glob("*.whl") if _is_pure(p)] if built.returncode == 0 else []
                if found:
                    log(f"  {spec}: no wheel published; built {found[0].name} from {sdist.name}")
        if not found:  # not pure: one wheel for this interpreter, one for the device's CPython 3.12
            here = _pip("download", "--no-deps", "--only-binary=:all:", "-d", str(tmp / "bin"), spec)
            platforms = [a for p in ("manylinux_2_28_x86_64", "manylinux2014_x86_64") for a in ("--platform", p)]
            there = _pip("download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                         "cp", *platforms, "-d", str(tmp / "bin"), spec)
            found = list((tmp / "bin").glob("*.whl")) if here.returncode == there.returncode == 0 else []
            if not found:
                error = (here.stderr or pure.stderr).strip().splitlines()
                raise BundleError(f"cannot fetch {spec}: {error[-1] if error else 'pip found nothing'}")
            log(f"  {spec}: not pure Python; fetched {', '.join(p.name for p in found)}")
        return [Path(shutil.copy2(p, dest / p.name)) for p in found]


def _pin(spec: str) -> tuple[str, str | None]:
    """``"supar==1.1.4"`` -> ``("supar", "1.1.4")``; ``"nltk"`` -> ``("nltk", None)`` (the index's newest)."""
    name, _, version = spec.partition("==")
    return normalize(name), version or None


def _sync_wheels(wanted: dict[str, str | None], dest: Path, log=print) -> list[Path]:
    """Fetch every wanted wheel into ``dest`` and remove the others (two versions of one package stop pip)."""
    kept = [p for name, version in wanted.items() for p in fetch(name, version, dest, log)]
    for stale in set(dest.glob("*.whl")) - set(kept):
        log(f"  removing {stale.name} (no longer wanted)")
        stale.unlink()
    return sorted(kept)


# ---------------------------------------------------------------------------------------------------- the data


def _sync_data(source: Path, dest: Path) -> tuple[list[Path], list[dict]]:
    """Copy :data:`DATASETS` (and the data root's MANIFEST.md) from ``source`` into ``dest``; files already there
    with the same size are kept. Returns the files and what was left out."""
    if not source.is_dir():
        raise BundleError(f"no data root at {source}: set LATENTSTRUCT_DATA or pass --data DIR (or --no-data)")
    wanted = {p.relative_to(source) for name in DATASETS if (source / name).is_dir()
              for p in (source / name).rglob("*") if p.is_file()}
    wanted |= {Path("MANIFEST.md")} if (source / "MANIFEST.md").is_file() else set()
    for rel in sorted(wanted):
        target = dest / rel
        if not target.is_file() or target.stat().st_size != (source / rel).stat().st_size:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / rel, target)
    for extra in [p for p in dest.rglob("*") if p.is_file() and p.relative_to(dest) not in wanted]:
        extra.unlink()
    left = [{"path": p.name, "bytes": _size(p), "why": "no experiment reads it"}
            for p in sorted(source.iterdir()) if p.is_dir() and p.name not in DATASETS]
    left += [{"path": name, "bytes": 0, "why": f"absent from {source}"} for name in DATASETS
             if not (source / name).is_dir()]
    return sorted(dest / rel for rel in wanted), left


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tree_bytes() -> int:
    """What a device call sends of this checkout besides carried folders: tracked and untracked-not-ignored files."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    return sum((ROOT / f).stat().st_size for f in listed if f and (ROOT / f).is_file())


def commit_stamp() -> str:
    """``<sha>`` of HEAD, ``+dirty`` when tracked files differ from it (as the run records say it)."""
    git = ["git", "-C", str(ROOT)]
    sha = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           check=True).stdout.strip()
    return sha.stdout.strip() + ("+dirty" if dirty else "")


# ---------------------------------------------------------------------------------------------------- build


def build(out: Path, data_root: Path | None, bench: bool = True, log=print) -> dict:
    """Fill ``out`` (wheels/, bench/ unless not ``bench``, data/ unless ``data_root`` is None, commit.txt,
    bundle.json) and return the manifest (module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    bundle, image = plan()
    log(f"latentstruct's requirements the GPU image lacks: {', '.join(f'{n}=={v}' for n, v in bundle.items())}")
    wheels = _sync_wheels(bundle, out / "wheels", log)
    bench = _sync_wheels(dict(_pin(s) for s in BENCH), out / "bench", log) if bench else []
    files, left = _sync_data(data_root, out / "data") if data_root is not None else ([], [])
    if data_root is None and (out / "data").exists():
        shutil.rmtree(out / "data")
    (out / STAMP).write_text(commit_stamp() + "\n")
    entry = lambda p: {"file": str(p.relative_to(out)), "bytes": p.stat().st_size,  # noqa: E731
                       "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
    sizes = {"wheels": sum(map(_size, wheels)), "bench": sum(map(_size, bench)), "data": sum(map(_size, files))}
    manifest = {
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": (out / STAMP).read_text().strip(),
        "python_here": sys.version.split()[0],
        "wheels": [entry(p) | {"name": _wheel_name(p)[0], "version": _wheel_name(p)[1]} for p in wheels],
        "bench": [entry(p) | {"name": _wheel_name(p)[0], "version": _wheel_name(p)[1]} for p in bench],
        "from_the_image": image,
        "data": [{"file": str(p.relative_to(out)), "bytes": p.stat().st_size} for p in files],
        "data_left_out": left,
        "bytes": sizes | {"bundle": sum(sizes.values()), "tree": tree_bytes()},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    _summary(manifest, log)
    return manifest


def _summary(m: dict, log) -> None:
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    b = m["bytes"]
    log(f"bundle at commit {m['commit']}: wheels {mib(b['wheels'])} ({len(m['wheels'])}), bench {mib(b['bench'])} "
        f"({len(m['bench'])}), data {mib(b['data'])} ({len(m['data'])} files); with the working tree "
        f"({mib(b['tree'])}) a device call carrying all of it sends {mib(b['bundle'] + b['tree'])} of "
        f"{mib(CARRY_LIMIT)}")
    for item in m["data_left_out"]:
        log(f"  left out of data/: {item['path']} ({mib(item['bytes'])}): {item['why']}")
    if b["bundle"] + b["tree"] > CARRY_LIMIT:
        log("  warning: more than a device call carries: name only the folders a command needs in `carry`")


# ------------------------------------------------------------------------------------------------ install, venv


def pip_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a pip that sees the bundle alone: no configuration file, no PIP_* setting of the machine
    (this one's PIP_FIND_LINKS, for one, would offer wheels the device does not have)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("PIP_")}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def install(bundle: Path, python: str = sys.executable, project: Path = ROOT, extras: tuple[str, ...] = EXTRAS,
            bench_target: Path | None = None, env: dict[str, str] | None = None) -> None:
    """Install latentstruct (editable, from ``project``) into ``python``'s environment with the bundle's wheels alone,
    and the bench references into ``bench_target`` if given (module docstring)."""
    wheels = Path(bundle) / "wheels"
    if not any(wheels.glob("*.whl")):
        raise BundleError(f"no wheels in {wheels}: run make device-bundle first")
    cmd = [python, "-m", "pip", "install", "-q", "--no-compile", "--no-index", "--find-links", str(wheels),
           "--no-build-isolation", "-e", f"{project}[{','.join(extras)}]"]
    _check(subprocess.run(cmd, env=pip_env(env), capture_output=True, text=True), "installing latentstruct")
    if bench_target is not None:
        cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(bench_target),
               *map(str, sorted((Path(bundle) / "bench").glob("*.whl")))]
        _check(subprocess.run(cmd, env=pip_env(env), capture_output=True, text=True), "installing the bench libraries")


def _check(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode:
        lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        raise BundleError(f"{what} from the bundle failed: {lines[-1] if lines else f'exit {proc.returncode}'}\n"
                          + "\n".join(lines[-15:]))


def image_closure() -> dict[str, metadata.Distribution]:
    """This interpreter's distributions of the GPU image's packages and of everything they require, by name."""
    installed = {normalize(d.metadata["Name"]): d for d in metadata.distributions()}
    todo = [n for n in installed if n in GPU_IMAGE]
    found: dict[str, metadata.Distribution] = {}
    while todo:
        name = todo.pop()
        if name in found or name not in installed:
            continue
        found[name] = installed[name]
        todo += [normalize(r.name) for r in _requires(installed[name], set())]
    return found


def make_venv(path: Path) -> Path:
    """A fresh venv at ``path`` that sees, besides the standard library, only this interpreter's copies of the GPU
    image's packages and of their requirements (symbolic links in ``<path>/gpu-image``, named by a ``.pth`` file);
    returns its python. Refuses if those include a package the bundle must provide."""
    path = Path(path)
    bundled, _ = plan()
    dists = image_closure()
    clash = sorted(set(dists) & set(bundled))
    if clash:
        raise BundleError(f"the GPU image's packages require {', '.join(clash)}, which the bundle provides")
    venv_module.EnvBuilder(symlinks=True, with_pip=False, clear=True).create(path)
    links = path / "gpu-image"
    links.mkdir()
    for dist in dists.values():
        root = Path(dist.locate_file(""))
        for top in {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] != ".." and f.suffix != ".pth"}:
            if top != "__pycache__" and (root / top).exists() and not (links / top).exists():
                (links / top).symlink_to(root / top)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (path / "lib" / version / "site-packages" / "gpu-image.pth").write_text(f"{links}\n")
    return path / "bin" / "python"


# ---------------------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/bundle.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="fetch the wheels, copy the data, stamp the commit (needs the package index)")
    b.add_argument("--out", type=Path, default=ROOT / ".device")
    b.add_argument("--data", type=Path, default=os.environ.get("LATENTSTRUCT_DATA"),
                   help="the data root to copy from (default: $LATENTSTRUCT_DATA)")
    b.add_argument("--no-data", action="store_true", help="wheels only")
    i = sub.add_parser("install", help="install latentstruct into this interpreter from the bundle alone")
    i.add_argument("--bundle", type=Path, default=ROOT / ".device")
    i.add_argument("--bench-target", type=Path, help="also install the bench references into this folder")
    v = sub.add_parser("venv", help="a venv that sees only the GPU image's packages (prints its python)")
    v.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            if not args.no_data and args.data is None:
                raise BundleError("no data root: set LATENTSTRUCT_DATA or pass --data DIR (or --no-data)")
            build(args.out, None if args.no_data else Path(args.data))
        elif args.command == "install":
            install(args.bundle, bench_target=args.bench_target)
            print(f"installed latentstruct from {args.bundle} into {sys.prefix}")
        else:
            print(make_venv(args.path))
    except BundleError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
