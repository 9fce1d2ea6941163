"""scripts/bundle.py: latentstruct installs from the device bundle alone into a venv that sees only what the GPU
machine has, and trains a step there, so the bundle is complete; and what the bundle is made of."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import bundle
from tests.helpers import ROOT

BUNDLE = ROOT / ".device"
#: importable in a venv of the GPU image's packages; and only once the bundle is installed
IMAGE = ["torch", "numpy", "scipy", "pandas", "sklearn", "matplotlib", "yaml", "tqdm", "joblib", "pytest"]
BUNDLED = ["hydra", "omegaconf", "antlr4", "entmax", "submitit", "hydra_plugins.hydra_joblib_launcher",
           "hydra_plugins.hydra_submitit_launcher", "latentstruct"]


def _index_reachable(tmp: Path) -> str | None:
    """None if pip can fetch one small wheel from the package index within seconds, else pip's last words."""
    entmax = bundle.plan()[0]["entmax"]
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--timeout",
                           "15", "--retries", "1", "-d", str(tmp), f"entmax=={entmax}"], capture_output=True, text=True)
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["no answer"])[-1]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """``make device-bundle``'s .device when it holds wheels (what the device is sent); else a bundle of wheels alone,
    fetched into the user's cache (``$XDG_CACHE_HOME`` or ``~/.cache``, ``latentstruct/device-bundle``: kept for the
    next sessions and every clone, as pip keeps its downloads; it took 40 s of a fresh clone's suite to fetch them and
    build antlr4's wheel) unless they are there already; skipped when they must be fetched and the package index
    cannot be reached."""
    if any((BUNDLE / "wheels").glob("*.whl")):
        return BUNDLE
    out = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "latentstruct" / "device-bundle"
    have = {bundle._wheel_name(p) for p in (out / "wheels").glob("*.whl")}
    if have != set(bundle.plan()[0].items()):
        offline = _index_reachable(tmp_path_factory.mktemp("probe"))
        if offline:
            pytest.skip(f"no .device bundle (make device-bundle) and the package index is unreachable: {offline}")
        bundle.build(out, None, bench=False, log=lambda _: None)
    return out


def _importable(python: Path, modules: list[str], env: dict, cwd: Path) -> list[str]:
    code = ("import importlib.util, sys\n"
            "def found(m):\n"
            "    try:\n"
            "        return importlib.util.find_spec(m) is not None\n"
            "    except ModuleNotFoundError:\n"
            "        return False\n"
            "print(' '.join(m for m in sys.argv[1:] if found(m)))")
    proc = subprocess.run([python, "-c", code, *modules], env=env, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.slow
def test_latentstruct_installs_from_the_bundle_alone_and_trains_a_step(wheels, tmp_path):
    python = bundle.make_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of this checkout on the path
    env["LATENTSTRUCT_GIT_COMMIT"] = "0123456789ab+dirty"  # the copy below has no git: the bundle's stamp
    assert _importable(python, IMAGE + BUNDLED, env, tmp_path) == IMAGE  # the image's packages, not the bundle's

    project = tmp_path / "project"  # a copy: the editable install writes nothing into this checkout
    for name in ("latentstruct", "configs"):
        shutil.copytree(ROOT / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, project / name)
    bundle.install(wheels, python=str(python), project=project, env=env)  # pip --no-index: the bundle or nothing
    assert _importable(python, IMAGE + BUNDLED, env, tmp_path) == IMAGE + BUNDLED

    run = subprocess.run([python, "-m", "latentstruct.train", "-m", "trainer.max_steps=1", "dataset.n_train=50",
                          "dataset.n_valid=20", "dataset.n_test=20", "trainer.progress=false", "hydra/launcher=joblib",
                          "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={tmp_path / 'runs'}"],
                         env=env, cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    (record_path,) = (tmp_path / "runs").rglob("metrics.json")
    record = json.loads(record_path.read_text())
    assert record["status"] == "completed" and record["steps"] == 1
    assert (record["git_commit"], record["git_dirty"]) == ("0123456789ab", True)


def test_the_bundle_is_latentstructs_requirements_the_gpu_image_lacks():
    bundled, image = bundle.plan()
    assert set(bundled) == {"hydra-core", "omegaconf", "antlr4-python3-runtime", "entmax", "hydra-joblib-launcher",
                            "hydra-submitit-launcher", "submitit"}
    assert {"torch", "numpy", "scipy", "pandas", "matplotlib", "pyyaml", "packaging"} <= set(image)
    assert "wandb" not in bundled and "wandb" not in image  # an optional extra


def test_pip_sees_the_bundle_alone():
    env = bundle.pip_env({"PIP_FIND_LINKS": "/somewhere", "PIP_INDEX_URL": "x", "PATH": "/bin"})
    assert env == {"PATH": "/bin", "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def test_install_without_wheels_says_to_build_the_bundle(tmp_path):
    with pytest.raises(bundle.BundleError, match="run make device-bundle first"):
        bundle.install(tmp_path)
