"""Opening data files whatever their compression, and finding the first of several candidate names.

:func:`open_binary` looks at the magic bytes, not at the suffix: ``1f 8b`` gzip, ``fd 37 7a 58 5a 00`` xz, ``BZh``
bzip2, ``PK 03 04`` zip (the archive must hold exactly one file that is not a directory, as the official GloVe zips
do), anything else is read as it is. The image readers (IDX files, usually gzipped) and the text readers (SST,
SNLI, GloVe) both open their files through it.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

__all__ = ["open_binary", "open_text", "first_file"]

_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_BZ2_MAGIC = b"BZh"
_ZIP_MAGIC = b"PK\x03\x04"


@contextlib.contextmanager
def open_binary(path: str | Path) -> Iterator[IO[bytes]]:
    """Open ``path`` for reading bytes, decompressed by its magic bytes (module docstring)."""
    path = Path(path)
    with open(path, "rb") as probe:
        magic = probe.read(6)
    with contextlib.ExitStack() as stack:
        if magic.startswith(_GZIP_MAGIC):
            yield stack.enter_context(gzip.open(path, "rb"))
        elif magic.startswith(_XZ_MAGIC):
            yield stack.enter_context(lzma.open(path, "rb"))
        elif magic.startswith(_BZ2_MAGIC):
            yield stack.enter_context(bz2.open(path, "rb"))
        elif magic.startswith(_ZIP_MAGIC):
            archive = stack.enter_context(zipfile.ZipFile(path))
            members = [m for m in archive.infolist() if not m.is_dir()]
            if len(members) != 1:
                names = ", ".join(m.filename for m in members)
                raise ValueError(f"{path}: a zip must hold exactly one file to be read, found: {names}")
            yield stack.enter_context(archive.open(members[0]))
        else:
            yield stack.enter_context(open(path, "rb"))


@contextlib.contextmanager
def open_text(path: str | Path) -> Iterator[IO[str]]:
    """Open ``path`` as UTF-8 text (undecodable bytes replaced, ``\n`` line ends), decompressed by
    :func:`open_binary`."""
    with open_binary(path) as raw:
        yield io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="\n")


def first_file(candidates: Iterable[Path]) -> Path | None:
    """The first candidate that is an existing file, or None."""
    return next((c for c in candidates if c.is_file()), None)
