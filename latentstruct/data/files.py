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
import os
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

__all__ = ["open_binary", "open_text", "read_lines", "first_file", "stream_error", "STREAM_ERRORS", "DATA_ENV",
           "DataMissing", "data_missing"]

#: The one rule for where the real datasets are, for every entry point (the CLI, make, the library, the tests):
#: ``$LATENTSTRUCT_DATA``, else ``paths.data_dir`` (whose default is ``data`` under the working directory).
DATA_ENV = "LATENTSTRUCT_DATA"
_HOW = ("docs/reference.md (Data) says what each dataset's folder holds and where to get it; "
        "scripts/download_text_data.sh fetches SST, SNLI and GloVe")

_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_BZ2_MAGIC = b"BZh"
_ZIP_MAGIC = b"PK\x03\x04"

#: what a damaged compressed stream raises while it is read (gzip's BadGzipFile and bz2's errors are OSErrors)
STREAM_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile)

#: OSErrors about the file itself, not its content: left as they are
_FILE_ERRORS: tuple[type[OSError], ...] = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


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


def _stream_kind(path: Path) -> str:
    with open(path, "rb") as probe:
        magic = probe.read(6)
    for kind, prefix in (("gzip", _GZIP_MAGIC), ("xz", _XZ_MAGIC), ("bzip2", _BZ2_MAGIC), ("zip", _ZIP_MAGIC)):
        if magic.startswith(prefix):
            return kind
    return "plain"


def stream_error(path: str | Path, err: BaseException, where: str = "") -> ValueError:
    """The one-line ``ValueError`` for a compressed stream that could not be read (``where``: e.g. ``" after line
    3"``)."""
    kind = _stream_kind(Path(path))
    detail = " ".join(f"{type(err).__name__}: {err}".split())
    return ValueError(f"{path}: corrupt or truncated {kind} stream{where} ({detail})")


def read_lines(path: str | Path, final_newline: bool = True) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` for every line of ``path`` (decompressed by :func:`open_binary`), each decoded strictly
    as UTF-8 with its ``\n`` kept; damage raises one ``ValueError`` line naming the file (module docstring).

    ``final_newline``: a last line without its ``\n`` is taken for a file cut mid-line. False for the formats whose
    official files end without one (CoNLL-2003, the Mulan ARFF files), whose readers find a cut line by its content
    (too few fields, an unknown tag, an unclosed sparse row); a cut inside a last number is then not seen."""
    lineno, last = 0, b"\n"
    try:
        with open_binary(path) as raw:
            for lineno, last in enumerate(raw, 1):
                try:
                    line = last.decode("utf-8")
                except UnicodeDecodeError as err:
                    what = f"byte 0x{last[err.start]:02X} at column {err.start + 1}"
                    raise ValueError(f"{path}:{lineno}: invalid UTF-8 ({what})") from None
                yield lineno, line
    except _FILE_ERRORS:
        raise
    except STREAM_ERRORS as err:
        raise stream_error(path, err, f" after line {lineno}") from None
    if lineno == 0:
        raise ValueError(f"{path}: the file is empty")
    if final_newline and not last.endswith(b"\n") and last.strip():
        raise ValueError(
            f"{path}:{lineno}: the last line has no line end, so the file looks truncated mid-line (a complete file "
            "ends with a newline)"
        )


def first_file(candidates: Iterable[Path]) -> Path | None:
    """The first candidate that is an existing file, or None."""
    return next((c for c in candidates if c.is_file()), None)


class DataMissing(FileNotFoundError):
    """A dataset's file is not where the run looked: the message names the file, the root and how it was chosen
    (``$LATENTSTRUCT_DATA``, else ``paths.data_dir``) and how to get the data."""


def data_missing(err: BaseException, data_dir: str | Path) -> DataMissing | None:
    """The :class:`DataMissing` for an error raised while a dataset was read from ``data_dir`` (a run's
    ``paths.data_dir``), or None when no FileNotFoundError is behind it (Hydra's instantiate wraps the reader's)."""
    cause, seen = err, set()
    while cause is not None and not isinstance(cause, FileNotFoundError) and id(cause) not in seen:
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    if cause is None or isinstance(cause, DataMissing):
        return cause
    env = os.environ.get(DATA_ENV)
    root = Path(data_dir)
    source = (f"${DATA_ENV}={env}" if env and root == Path(env)
              else f"paths.data_dir={data_dir}" + ("" if env else f" (${DATA_ENV} is unset)"))
    missing = str(cause.args[-1] if cause.args else cause) if not cause.filename else f"no file {cause.filename}"
    return DataMissing(
        f"{missing.rstrip('.')}. The data root is {root.resolve()} ({source}); the rule, for every entry point: "
        f"${DATA_ENV}, else paths.data_dir (default: data/ under the working directory). Point "
        f"{DATA_ENV}=<folder> (or paths.data_dir=<folder>) at the folder that holds the datasets; {_HOW}."
    )

