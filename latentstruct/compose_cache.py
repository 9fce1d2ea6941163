"""Hydra's composition made cheaper, with the same result.

Hydra 1.3 spends about a third of each ``compose`` on work that does not depend on the overrides: it deep-copies its
config repository (and with it every structured config in the ``ConfigStore``, ours included) and reads, parses and
wraps every config file again. Composition runs more often than it seems — twice per ``python -m latentstruct.train``
(the command-line check, then Hydra), once per job of a sweep (up to a cap) before it starts, some 950 times in the
test suite — so :func:`install` (run when :mod:`latentstruct.config` is imported) removes both costs, and a third:

* the ``ConfigStore`` is shared, not copied, by the copies of the repository: Hydra's own ``ConfigStore.load``
  already hands out a deep copy of what it stores, so nothing reached through the repository can change it;
* what a config *file* loads to (its parsed config, header and defaults list) is kept per file, keyed by the file's
  path, size, modification time and inode, and each load gets a deep copy of it: an edited file is read again, and
  no composition can change what another one reads. Structured configs and missing files are not kept;
* the map that resolves interpolated defaults (``- model: ${task}``) is built only for a defaults list that has one:
  Hydra builds it, an ``OmegaConf`` of every choice made so far, for every config of the tree (some 35 per
  composition), and reads it only to resolve such a default.

``tests/test_config.py`` checks that each experiment family's first experiment, a sweep and the default compose to
the same configuration (its ``hydra`` node included) with and without these, and that an edited file is read again.
The time saved: ``make bench-compose`` (results/bench/compose.md).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from typing import Any

from hydra._internal import defaults_list
from hydra._internal.config_repository import CachingConfigRepository, ConfigRepository
from hydra.core.config_store import ConfigStore
from hydra.core.object_type import ObjectType

_HYDRA = ConfigRepository.load_config, CachingConfigRepository.__init__, defaults_list._create_interpolation_map
_loaded: dict[tuple, Any] = {}  # (source, config path, file stat) -> Hydra's ConfigResult, never handed out itself


def _file_key(source: Any, config_path: str) -> tuple | None:
    """What identifies what ``config_path`` loads to from ``source``: the source's provider and search path (Hydra
    records both in the result), then the file's path and stat for a directory of config files, the package and name
    for an installed package's (Hydra's own, which do not change while a process runs); ``None`` for any other source
    (structured configs), which is not kept. (Sources are told apart by their scheme: Hydra loads its plugin modules
    a second time, so their classes are not the ones importable.)"""
    name = source._normalize_file_name(config_path)
    if source.scheme() == "file":
        path = os.path.realpath(os.path.join(source.path, name))
        try:
            st = os.stat(path)
        except OSError:
            return None
        return "file", source.provider, source.path, path, st.st_size, st.st_mtime_ns, st.st_ino
    if source.scheme() == "pkg":
        return "pkg", source.provider, source.path, name
    return None


def _load_config(self: ConfigRepository, config_path: str) -> Any:
    source = self._find_object_source(config_path=config_path, object_type=ObjectType.CONFIG)
    key = None if source is None else _file_key(source, config_path)
    if key is None:
        return _HYDRA[0](self, config_path)
    if key not in _loaded:
        _loaded[key] = _HYDRA[0](self, config_path)
    return copy.deepcopy(_loaded[key])  # Hydra edits what it loads (packages, the defaults it has read)


def _copy_sharing_the_store(self: CachingConfigRepository, delegate: ConfigRepository) -> None:
    store = ConfigStore.instance()
    self.delegate = copy.deepcopy(delegate, {id(store): store})  # Hydra copies it so as not to change its sources
    self.cache = {}


def _interpolation_map_if_read(overrides: Any, defaults: list, self_added: bool) -> Any:
    """Hydra's map of the choices made so far, or ``None`` where no default in ``defaults`` is interpolated: Hydra's
    ``_create_defaults_tree_impl`` reads the map only to resolve those (the same defaults, met as its children)."""
    if not any(d.is_interpolation() for d in defaults):
        return None
    return _HYDRA[2](overrides, defaults, self_added)


_OURS = _load_config, _copy_sharing_the_store, _interpolation_map_if_read


def _set(functions: tuple) -> None:
    ConfigRepository.load_config, CachingConfigRepository.__init__, defaults_list._create_interpolation_map = functions


def install() -> None:
    """Make every later composition in this process use the three shortcuts above (idempotent)."""
    _set(_OURS)


@contextlib.contextmanager
def uninstalled() -> Iterator[None]:
    """Hydra as it comes, inside the block (for the test that compares the two, and the benchmark)."""
    _set(_HYDRA)
    try:
        yield
    finally:
        _set(_OURS)
