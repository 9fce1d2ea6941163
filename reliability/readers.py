"""Damaged input files (issue #20 part 5): a catalogue of every real-format reader, the ways its files get damaged,
and a check that each damage ends in one clear line.

Cases
-----
:data:`CASES` maps a name to a :class:`Case`: a function writing a small **valid** file of the format (with its
companions, e.g. an MNIST folder or an ARFF with its Mulan XML) into a folder and returning the file to damage, the
reader (called on that file; it returns a list of records that can be compared), the mutations that apply, whether
the format is line-oriented text, and the format's own undetectable damages. Cases: ``sst``, ``snli_jsonl``,
``snli_tsv``, ``snli_tsv_gz``, ``glove``, ``conll``, ``twpos``, ``arff_dense``, ``arff_sparse``, ``mulan_xml``,
``idx``, ``idx_gz``, ``cifar10``, ``listops``, ``cora_tagged`` (Cora's inline tags), ``cora_columns`` (Cora's CRF++
columns).

Mutations
---------
Plain deterministic functions over bytes with explicit parameters: :func:`truncate`, :func:`cut_mid_record` (a line
loses its end but keeps its newline), :func:`wrong_field_count` (a field of a line duplicated or deleted),
:func:`wrong_label` (the label field of a line replaced by a value outside the label set), :func:`bad_encoding` (a
byte 0xFF, never valid UTF-8, inserted), :func:`wrong_magic` (one byte of a binary format's magic changed),
:func:`corrupt_byte` (a byte of a compressed payload flipped), :func:`idx_wrong_label`, :func:`idx_wrong_count` and
:func:`pickle_wrong_label`, :func:`pickle_drop_label` (binary formats). Each case binds the format's own constants
(separator, label pattern, invalid values) and a ``draw`` of the free parameters from a ``draw(name, lo, hi)``
callable (an inclusive integer range), so :func:`run` draws them from a seeded ``random.Random`` and the tests from
hypothesis with the same code.

Verdicts (:func:`check`)
------------------------
* ``clear``: the reader raised ``ValueError`` (or a subclass) or ``FileNotFoundError`` whose message is one line,
  contains the damaged file's name and, for the text formats, a position: ``file:LINE:``, ``line N``, ``record N``
  or ``label N`` (or says that the file is empty);
* ``unclear``: any other exception, or a message on several lines, without the file's name or without a position;
* ``undetectable``: the read succeeded and the damaged file is itself a valid file, by this rule:

  1. a truncation exactly at a line end of a plain line-oriented text file (``at > 0`` and the byte before ``at``
     is ``\\n``): a shorter valid file, which no reader of a format without counts can tell apart (for the sentence
     formats, CoNLL and Twitter POS, this includes a cut between two token lines: the last sentence looks shorter).
     A truncation to nothing is *not* undetectable: the readers refuse an empty file;
  2. any damage after which the reader returns exactly the records of the valid file (the damage changed nothing
     the reader uses, e.g. a JSON key written twice with the same value, or the gzip header's timestamp);
  3. the format's own ambiguities, listed in the case (:attr:`Case.undetectable`): a GloVe line with one more field
     is a word containing a space (840B has such words); a cut inside the last field of an SNLI TSV line (a sentence)
     or of a GloVe line (a number) that leaves its newline is a shorter sentence or another number; a Cora citation
     cut right after one of its closing tags is a citation with fewer fields; a sparse ARFF
     row without one of its entries is a row with that value 0; in the formats whose official files end without a
     newline (CoNLL-2003, the Mulan ARFF files), a truncation just before a line's newline leaves a complete file;
* ``silent``: the read succeeded with records different from the valid file's and none of the rules above applies.

A wrong label *inside* the label set (an SST 3 written 4) is undetectable by any reader and is not a mutation here.
"""

from __future__ import annotations

import functools
import gzip
import json
import pickle
import random
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CASES",
    "VERDICTS",
    "Case",
    "Mutation",
    "Outcome",
    "bad_encoding",
    "check",
    "corrupt_byte",
    "cut_mid_record",
    "draw_params",
    "idx_wrong_count",
    "idx_wrong_label",
    "pickle_drop_label",
    "pickle_wrong_label",
    "run",
    "summary",
    "truncate",
    "valid_bytes",
    "wrong_field_count",
    "wrong_label",
    "wrong_magic",
]

VERDICTS: tuple[str, ...] = ("clear", "unclear", "silent", "undetectable")

#: ``draw(name, lo, hi)``: an integer in ``lo..hi`` (inclusive) for the parameter ``name``
Draw = Callable[[str, int, int], int]

# --- mutations -----------------------------------------------------------------------------------------------------


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def _body(line: bytes) -> tuple[bytes, bytes]:
    """A line split into its content and its line end."""
    content = line.rstrip(b"\r\n")
    return content, line[len(content):]


def truncate(data: bytes, at: int) -> bytes:
    """The first ``at`` bytes."""
    return data[:at]


def cut_mid_record(data: bytes, line_index: int, keep: int) -> bytes:
    """Line ``line_index`` cut after its first ``keep`` bytes, its line end and the lines after it kept (``keep`` ≥ 1:
    a line cut to nothing is a blank line, which the text formats skip or read as a sentence end, i.e. a deleted
    record, which no reader can tell from a valid file)."""
    lines = _lines(data)
    content, end = _body(lines[line_index])
    lines[line_index] = content[:keep] + end
    return b"".join(lines)


def wrong_field_count(data: bytes, line_index: int, field_index: int, extra: int, sep: bytes) -> bytes:
    """Field ``field_index`` (split by ``sep``) of line ``line_index`` written twice (``extra`` = 1) or deleted
    (``extra`` = 0)."""
    lines = _lines(data)
    content, end = _body(lines[line_index])
    fields = content.split(sep)
    if extra:
        fields.insert(field_index, fields[field_index])
    else:
        del fields[field_index]
    lines[line_index] = sep.join(fields) + end
    return b"".join(lines)


def wrong_label(data: bytes, line_index: int, value: bytes, pattern: bytes) -> bytes:
    """The first group of the first match of ``pattern`` in line ``line_index`` replaced by ``value``."""
    lines = _lines(data)
    content, end = _body(lines[line_index])
    match = re.search(pattern, content)
    if match is None:
        raise ValueError(f"no label ({pattern!r}) in line {line_index}: {content!r}")
    lines[line_index] = content[: match.start(1)] + value + content[match.end(1):] + end
    return b"".join(lines)


def bad_encoding(data: bytes, at: int) -> bytes:
    """The byte 0xFF (never valid in UTF-8) inserted before byte ``at``."""
    return data[:at] + b"\xff" + data[at:]


def wrong_magic(data: bytes, at: int, value: int) -> bytes:
    """Byte ``at`` (one of the format's magic bytes) set to ``value``."""
    return data[:at] + bytes([value]) + data[at + 1:]


def corrupt_byte(data: bytes, at: int, xor: int) -> bytes:
    """Byte ``at`` xor-ed with ``xor`` (1..255): a damaged byte inside a compressed stream."""
    return data[:at] + bytes([data[at] ^ xor]) + data[at + 1:]


def _idx_header(data: bytes) -> int:
    return 4 + 4 * data[3]


def idx_wrong_label(data: bytes, record: int, value: int) -> bytes:
    """Record ``record`` of a uint8 IDX label file set to ``value``."""
    at = _idx_header(data) + record
    return data[:at] + bytes([value]) + data[at + 1:]


def idx_wrong_count(data: bytes, dim: int, value: int) -> bytes:
    """Size ``dim`` of an IDX header set to ``value``."""
    at = 4 + 4 * dim
    return data[:at] + int(value).to_bytes(4, "big") + data[at + 4:]


def _repickle(data: bytes, edit: Callable[[dict], None]) -> bytes:
    batch = pickle.loads(data, encoding="bytes")  # our own generated batch: trusted
    edit(batch)
    return pickle.dumps(batch, protocol=2)


def pickle_wrong_label(data: bytes, record: int, value: int) -> bytes:
    """A CIFAR-10 batch pickle with label ``record`` set to ``value``."""
    return _repickle(data, lambda batch: batch[b"labels"].__setitem__(record, value))


def pickle_drop_label(data: bytes, record: int) -> bytes:
    """A CIFAR-10 batch pickle with label ``record`` deleted (one label fewer than images)."""
    return _repickle(data, lambda batch: batch[b"labels"].pop(record))


# --- how each case draws the parameters ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutation:
    """A damage: ``apply(data, **params)`` with the parameters from ``draw(data, draw_fn)``."""

    apply: Callable[..., bytes]
    draw: Callable[[bytes, Draw], dict[str, Any]]


def _choice(draw: Draw, name: str, options: Sequence[Any]) -> Any:
    return options[draw(name, 0, len(options) - 1)]


def _truncation(data: bytes, draw: Draw) -> dict[str, Any]:
    return {"at": draw("at", 0, len(data) - 1)}


def _record_lines(data: bytes, keep: Callable[[list[bytes], int], bool]) -> list[int]:
    lines = _lines(data)
    return [i for i in range(len(lines)) if _body(lines[i])[0].strip() and keep(lines, i)]


def _cut(records: Callable[[list[bytes], int], bool]) -> Mutation:
    def draw_cut(data: bytes, draw: Draw) -> dict[str, Any]:
        lines = _lines(data)
        line_index = _choice(draw, "line_index", [i for i in _record_lines(data, records) if len(lines[i].strip()) > 1])
        return {"line_index": line_index, "keep": draw("keep", 1, len(_body(lines[line_index])[0]) - 1)}

    return Mutation(cut_mid_record, draw_cut)


def _field_count(records: Callable[[list[bytes], int], bool], sep: bytes) -> Mutation:
    def draw_fields(data: bytes, draw: Draw) -> dict[str, Any]:
        line_index = _choice(draw, "line_index", _record_lines(data, records))
        fields = _body(_lines(data)[line_index])[0].split(sep)
        return {"line_index": line_index, "field_index": draw("field_index", 0, len(fields) - 1),
                "extra": draw("extra", 0, 1)}

    return Mutation(functools.partial(wrong_field_count, sep=sep), draw_fields)


def _label(records: Callable[[list[bytes], int], bool], pattern: bytes, values: Sequence[bytes]) -> Mutation:
    def draw_label(data: bytes, draw: Draw) -> dict[str, Any]:
        lines = _lines(data)
        candidates = [i for i in _record_lines(data, records) if re.search(pattern, _body(lines[i])[0])]
        return {"line_index": _choice(draw, "line_index", candidates), "value": _choice(draw, "value", values)}

    return Mutation(functools.partial(wrong_label, pattern=pattern), draw_label)


def _encoding(data: bytes, draw: Draw) -> dict[str, Any]:
    return {"at": draw("at", 0, len(data))}


def _magic(positions: Sequence[int]) -> Mutation:
    def draw_magic(data: bytes, draw: Draw) -> dict[str, Any]:
        at = _choice(draw, "at", positions)
        value = draw("value", 0, 254)
        return {"at": at, "value": value + (value >= data[at])}  # any value but the right one

    return Mutation(wrong_magic, draw_magic)


def _gzip_payload(data: bytes, draw: Draw) -> dict[str, Any]:
    # bytes 4-9 of a gzip header (mtime, extra flags, OS) carry nothing the reader uses: damage starts at byte 10
    return {"at": draw("at", 10, len(data) - 1), "xor": draw("xor", 1, 255)}


def _any_line(lines: list[bytes], i: int) -> bool:
    return True


# --- the valid files -----------------------------------------------------------------------------------------------

_SST = b"""(3 (2 It) (4 (2 's) (3 good)))
(1 (2 A) (0 (1 dull) (2 film)))
(2 (2 It) (2 exists))
(4 (3 (2 Truly) (4 great)) (2 .))
"""

_SNLI = [
    ("neutral", "A man sleeps on a bench .", "The man is tired ."),
    ("entailment", "Two dogs run in the park .", "Dogs are running ."),
    ("-", "A woman sings .", "A woman is loud ."),
    ("contradiction", "A child is eating soup .", "Nobody is eating ."),
]

_GLOVE = b"""the 0.1 0.2 0.3
, 0.4 -0.5 0.6
of 1.5 2.5e-1 3
and -0.25 0 7.75
"""
_GLOVE_WORDS = ["the", ",", "of", "and", "absent"]

_CONLL = b"""-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

New NNP B-NP B-LOC
York NNP I-NP I-LOC
rejects VBZ B-VP O
"""

_TWPOS = b"I\tO\nwon't\tV\n\nhello world\t!\n:)\tE\n\n@ark\t@\nlol\t!\n"

_CORA_TAGGED = (b"<author> A. Cau, and R. Kuiper. </author> <title> Formalising Dijkstra's strategy. </title> "
                b"<date> 1992. </date>\n"
                b"<author> M. Shapiro. </author> <title> Fast analysis. </title> <booktitle> In Proc. POPL, "
                b"</booktitle> <pages> pp. 1-14, </pages> <date> 1997. </date>\n")
_CORA_COLUMNS = b"".join(
    b" ".join([word, *([b"f"] * 22), label]) + b"\n" if word else b"\n"
    for word, label in [(b"A.", b"author"), (b"Cau.", b"author"), (b"Formalising", b"title"), (b"1992.", b"date"),
                        (b"", b""), (b"M.", b"author"), (b"Fast", b"title"), (b"pp.", b"pages"), (b"1-14", b"pages")])

_ARFF_HEADER = b"""% a toy Mulan file
@relation toy
@attribute f0 numeric
@attribute f1 numeric
@attribute lab_a {0,1}
@attribute lab_b {0,1}
@data
"""
_ARFF_DENSE = _ARFF_HEADER + b"0.5,1.25,1,0\n0,2,0,1\n-1.5,0,1,1\n3,4,0,0\n"
_ARFF_SPARSE = _ARFF_HEADER + b"{0 0.5,1 1.25,2 1}\n{1 2,3 1}\n{}\n{0 -1,2 1,3 1}\n"
_MULAN_XML = b"""<?xml version="1.0" encoding="utf-8"?>
<labels xmlns="http://mulan.sourceforge.net/labels">
<label name="lab_a"></label>
<label name="lab_b"></label>
</labels>
"""

_LISTOPS = b"""3\t[MAX 1 3 ]
0\t( ( ( [SM 5 ) 5 ) ] )
7\t7
2\t( ( ( ( [MIN 4 ) ( ( ( [MAX 2 ) 1 ) ] ) ) 9 ) ] )
"""


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _snli_jsonl(folder: Path) -> Path:
    records = [{"gold_label": g, "sentence1": a, "sentence2": b} for g, a, b in _SNLI]
    return _write(folder / "snli_1.0_dev.jsonl", "".join(json.dumps(r) + "\n" for r in records).encode())


def _snli_tsv_text() -> bytes:
    return "".join(f"{g}\t{a}\t{b}\n" for g, a, b in _SNLI).encode()


def _idx(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in array.shape)
    return header + array.astype(np.uint8).tobytes()


def _mnist_folder(folder: Path, gz: bool) -> None:
    rng = np.random.RandomState(0)
    arrays = {
        "train-images-idx3-ubyte": rng.randint(0, 256, (4, 2, 3)), "train-labels-idx1-ubyte": np.array([0, 9, 3, 3]),
        "t10k-images-idx3-ubyte": rng.randint(0, 256, (2, 2, 3)), "t10k-labels-idx1-ubyte": np.array([1, 7]),
    }
    for name, array in arrays.items():
        data = _idx(array)
        _write(folder / (name + ".gz" if gz else name), gzip.compress(data, mtime=0) if gz else data)


def _idx_plain(folder: Path) -> Path:
    _mnist_folder(folder, gz=False)
    return folder / "train-labels-idx1-ubyte"


def _idx_gz(folder: Path) -> Path:
    _mnist_folder(folder, gz=True)
    return folder / "train-images-idx3-ubyte.gz"


def _cifar(folder: Path) -> Path:
    rng = np.random.RandomState(0)
    for k, name in enumerate([*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]):
        batch = {b"batch_label": name.encode(), b"labels": [k % 10, (k + 3) % 10],
                 b"data": rng.randint(0, 256, (2, 3072)).astype(np.uint8), b"filenames": [b"a.png", b"b.png"]}
        _write(folder / name, pickle.dumps(batch, protocol=2))
    return folder / "data_batch_1"


# --- the readers, each returning comparable records ----------------------------------------------------------------


def _read_sst(path: Path) -> list:
    from latentstruct.data.text import read_sst

    return read_sst(path, binary=False)


def _read_snli_jsonl(path: Path) -> list:
    from latentstruct.data.text import read_snli_jsonl

    return read_snli_jsonl(path)


def _read_snli_tsv(path: Path) -> list:
    from latentstruct.data.text import read_snli_tsv

    return read_snli_tsv(path)


def _read_glove(path: Path) -> list:
    from latentstruct.data.text import Vocab, read_glove

    vocab = Vocab([Vocab.PAD, Vocab.UNK, *_GLOVE_WORDS])
    matrix, found = read_glove(path, vocab)
    return [found, *(tuple(row) for row in matrix.tolist())]


def _read_conll(path: Path) -> list:
    from latentstruct.data.conll import read_conll

    return [tuple(map(tuple, s)) for s in read_conll(path)]


def _read_twpos(path: Path) -> list:
    from latentstruct.data.twpos import read_tagged

    return read_tagged(path)


def _read_cora_tagged(path: Path) -> list:
    from latentstruct.data.cora import read_cora_tagged

    return read_cora_tagged(path)


def _read_cora_columns(path: Path) -> list:
    from latentstruct.data.cora import read_cora_columns

    return read_cora_columns(path)


def _read_arff(path: Path, num_labels: int | None = 2) -> list:
    from latentstruct.data.mlc import read_arff

    data = read_arff(path, num_labels=num_labels)
    return [data.feature_names, data.label_names, *zip(data.x.tolist(), data.y.tolist(), strict=True)]


def _read_arff_with_xml(path: Path) -> list:
    return _read_arff(path.parent / "toy.arff", num_labels=None)


def _read_mnist(path: Path) -> list:
    from latentstruct.data.images import load_mnist

    data = load_mnist(path.parent)
    return [(split, x.tobytes(), int(y)) for split, (xs, ys) in data.items() for x, y in zip(xs, ys, strict=True)]


def _read_cifar(path: Path) -> list:
    from latentstruct.data.images import load_cifar10

    data = load_cifar10(path.parent)
    return [(split, x.tobytes(), int(y)) for split, (xs, ys) in data.items() for x, y in zip(xs, ys, strict=True)]


def _read_listops(path: Path) -> list:
    from latentstruct.data.listops import read_listops

    return read_listops(path)


# --- the catalogue -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A reader and its damages (module docstring). ``write(folder)`` writes the valid file(s) and returns the one to
    damage; ``read(path)`` reads it; ``undetectable(mutation, params, valid bytes)`` is the format's own rule 3."""

    write: Callable[[Path], Path]
    read: Callable[[Path], list]
    mutations: dict[str, Mutation]
    text: bool = True
    line_oriented: bool = True
    undetectable: Callable[[str, dict[str, Any], bytes], bool] = field(default=lambda mutation, params, data: False)


def _text_mutations(
    records: Callable[[list[bytes], int], bool], sep: bytes, pattern: bytes, values: Sequence[bytes]
) -> dict[str, Mutation]:
    return {
        "truncate": Mutation(truncate, _truncation),
        "cut_mid_record": _cut(records),
        "wrong_field_count": _field_count(records, sep),
        "wrong_label": _label(records, pattern, values),
        "bad_encoding": Mutation(bad_encoding, _encoding),
    }


def _cut_in_last_field(sep: bytes) -> Callable[[str, dict[str, Any], bytes], bool]:
    """Rule 3 for a free last field: a cut inside the line's last field (or right after its separator: an empty
    sentence, which the SNLI readers drop by design)."""

    def rule(mutation: str, params: dict[str, Any], data: bytes) -> bool:
        if mutation != "cut_mid_record":
            return False
        content = _body(_lines(data)[params["line_index"]])[0]
        return params["keep"] >= content.rfind(sep) + 1

    return rule


def _glove_rule(mutation: str, params: dict[str, Any], data: bytes) -> bool:
    if mutation == "wrong_field_count" and params["extra"]:
        return True  # one more field: a word containing a space, as 840B has
    return _cut_in_last_field(b" ")(mutation, params, data)


def _cut_before_line_end(mutation: str, params: dict[str, Any], data: bytes) -> bool:
    """Rule 3 for the formats whose official files end without a newline (CoNLL-2003, the Mulan ARFF files, read
    with ``final_newline=False``): a truncation just before a line's ``\n`` leaves a complete last line."""
    return mutation == "truncate" and data[params["at"]:params["at"] + 1] == b"\n"


def _sparse_rule(mutation: str, params: dict[str, Any], data: bytes) -> bool:
    if _cut_before_line_end(mutation, params, data):
        return True
    return mutation == "wrong_field_count" and not params["extra"]  # an entry left out is a value 0


def _cora_cut_after_a_field(mutation: str, params: dict[str, Any], data: bytes) -> bool:
    """Rule 3 for Cora's inline tags: a citation cut right after one of its closing tags (and any spaces) is a valid
    citation with fewer fields."""
    if mutation != "cut_mid_record":
        return False
    content = _body(_lines(data)[params["line_index"]])[0][: params["keep"]]
    return re.search(rb"</[a-z]+>\s*$", content) is not None


def _not_docstart(lines: list[bytes], i: int) -> bool:
    return not lines[i].startswith(b"-DOCSTART-")


def _arff_data(lines: list[bytes], i: int) -> bool:
    return any(line.strip().lower() == b"@data" for line in lines[:i])


def _xml_label(lines: list[bytes], i: int) -> bool:
    return b"<label " in lines[i]


CASES: dict[str, Case] = {
    "sst": Case(
        lambda folder: _write(folder / "train.txt", _SST), _read_sst,
        _text_mutations(_any_line, b" ", rb"^\((\d+)", [b"5", b"9", b"-1", b"x", b""]),
    ),
    "snli_jsonl": Case(
        _snli_jsonl, _read_snli_jsonl,
        _text_mutations(_any_line, b", ", rb'"gold_label": "([^"]*)"', [b"neutrall", b"Entailment", b"", b"0"]),
    ),
    "snli_tsv": Case(
        lambda folder: _write(folder / "dev.tsv", _snli_tsv_text()), _read_snli_tsv,
        _text_mutations(_any_line, b"\t", rb"^([^\t]*)", [b"neutrall", b"Entailment", b"", b"0"]),
        undetectable=_cut_in_last_field(b"\t"),
    ),
    "snli_tsv_gz": Case(
        lambda folder: _write(folder / "dev.tsv.gz", gzip.compress(_snli_tsv_text(), mtime=0)), _read_snli_tsv,
        {"truncate": Mutation(truncate, _truncation), "wrong_magic": _magic([0, 1]),
         "corrupt_byte": Mutation(corrupt_byte, _gzip_payload)},
        line_oriented=False,
    ),
    "glove": Case(
        lambda folder: _write(folder / "glove.txt", _GLOVE), _read_glove,
        _text_mutations(_any_line, b" ", rb" (\S+)$", [b"x", b"1.2.3", b"nan", b"inf", b"--1", b""]),
        undetectable=_glove_rule,
    ),
    "conll": Case(
        lambda folder: _write(folder / "train.txt", _CONLL), _read_conll,
        _text_mutations(_not_docstart, b" ", rb"(\S+)$", [b"B-XYZ", b"X", b"B-", b"I-per", b"PER"]),
        undetectable=_cut_before_line_end,
    ),
    "twpos": Case(
        lambda folder: _write(folder / "oct27.train", _TWPOS), _read_twpos,
        _text_mutations(_any_line, b"\t", rb"\t(.*)$", [b"NN", b"", b"?", b"o"]),
    ),
    "cora_tagged": Case(
        lambda folder: _write(folder / "cora.tagged.txt", _CORA_TAGGED), _read_cora_tagged,
        {"truncate": Mutation(truncate, _truncation), "cut_mid_record": _cut(_any_line),
         "wrong_label": _label(_any_line, rb"<([a-z]+)>", [b"titel", b"Author", b"", b"date2"]),
         "bad_encoding": Mutation(bad_encoding, _encoding)},
        undetectable=_cora_cut_after_a_field,
    ),
    "cora_columns": Case(
        lambda folder: _write(folder / "cora.train", _CORA_COLUMNS), _read_cora_columns,
        _text_mutations(_any_line, b" ", rb" (\S+)$", [b"writer", b"Author", b"", b"x"]),
    ),
    "arff_dense": Case(
        lambda folder: _write(folder / "toy.arff", _ARFF_DENSE), _read_arff,
        _text_mutations(_arff_data, b",", rb",([^,]*)$", [b"2", b"-1", b"0.5", b"?", b"x"]),
        undetectable=_cut_before_line_end,
    ),
    "arff_sparse": Case(
        lambda folder: _write(folder / "toy.arff", _ARFF_SPARSE), _read_arff,
        _text_mutations(_arff_data, b",", rb" ([^ ,}]*)\}$", [b"2", b"-1", b"0.5", b"?"]),
        undetectable=_sparse_rule,
    ),
    "mulan_xml": Case(
        lambda folder: (_write(folder / "toy.arff", _ARFF_DENSE), _write(folder / "toy.xml", _MULAN_XML))[1],
        _read_arff_with_xml,
        _text_mutations(_xml_label, b" ", rb'name="([^"]*)"', [b"lab_c", b"", b"f0"]),
        line_oriented=False,
    ),
    "idx": Case(
        _idx_plain, _read_mnist,
        {"truncate": Mutation(truncate, _truncation), "wrong_magic": _magic([0, 1, 2, 3]),
         "wrong_label": Mutation(idx_wrong_label, lambda data, draw: {"record": draw("record", 0, 3),
                                                                     "value": draw("value", 10, 255)}),
         "wrong_field_count": Mutation(idx_wrong_count, lambda data, draw: {"dim": 0, "value": draw("value", 0, 3)})},
        text=False, line_oriented=False,
    ),
    "idx_gz": Case(
        _idx_gz, _read_mnist,
        {"truncate": Mutation(truncate, _truncation), "wrong_magic": _magic([0, 1]),
         "corrupt_byte": Mutation(corrupt_byte, _gzip_payload)},
        text=False, line_oriented=False,
    ),
    "cifar10": Case(
        _cifar, _read_cifar,
        {"truncate": Mutation(truncate, _truncation), "wrong_magic": _magic([0, 1]),
         "wrong_label": Mutation(pickle_wrong_label, lambda data, draw: {
             "record": draw("record", 0, 1), "value": _choice(draw, "value", [10, 255, -1])}),
         "wrong_field_count": Mutation(pickle_drop_label, lambda data, draw: {"record": draw("record", 0, 1)})},
        text=False, line_oriented=False,
    ),
    "listops": Case(
        lambda folder: _write(folder / "test_d20s.tsv", _LISTOPS), _read_listops,
        _text_mutations(_any_line, b"\t", rb"^([^\t]*)", [b"10", b"x", b"-1", b""]),
    ),
}

# --- checking ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What a reader did with one damaged file."""

    reader: str
    mutation: str
    params: tuple[tuple[str, Any], ...]
    verdict: str
    message: str


_POSITION = re.compile(r":\d+:|\b(line|record|label) \d+|the file is empty")


@functools.cache
def _valid(case_name: str) -> tuple[bytes, str]:
    """The valid bytes of a case's damaged file and its records (as a repr, to compare)."""
    case = CASES[case_name]
    with tempfile.TemporaryDirectory() as tmp:
        path = case.write(Path(tmp))
        return path.read_bytes(), repr(case.read(path))


def valid_bytes(case_name: str) -> bytes:
    """The bytes of ``case_name``'s valid file (the one its mutations damage)."""
    return _valid(case_name)[0]


def draw_params(case_name: str, mutation_name: str, draw: Draw) -> dict[str, Any]:
    """The parameters of ``mutation_name`` on ``case_name``'s valid file, drawn by ``draw(name, lo, hi)``."""
    data, _ = _valid(case_name)
    return CASES[case_name].mutations[mutation_name].draw(data, draw)


def _verdict(case: Case, path: Path, err: BaseException) -> str:
    message = str(err)
    if not isinstance(err, (ValueError, FileNotFoundError)) or "\n" in message or path.name not in message:
        return "unclear"
    if case.text and not _POSITION.search(message):
        return "unclear"
    return "clear"


def check(
    case_name: str, mutation_name: str, rng_or_params: random.Random | dict[str, Any], workdir: str | Path
) -> Outcome:
    """Write ``case_name``'s valid file into a new folder under ``workdir``, damage it with ``mutation_name`` (the
    parameters given, or drawn from the ``random.Random``), read it and judge the result (module docstring)."""
    case = CASES[case_name]
    valid, valid_records = _valid(case_name)
    if isinstance(rng_or_params, random.Random):
        rng = rng_or_params
        params = draw_params(case_name, mutation_name, lambda name, lo, hi: rng.randint(lo, hi))
    else:
        params = dict(rng_or_params)
    folder = Path(tempfile.mkdtemp(prefix=f"{case_name}-{mutation_name}-", dir=workdir))
    path = case.write(folder)
    damaged = case.mutations[mutation_name].apply(valid, **params)
    path.write_bytes(damaged)
    key = tuple(sorted(params.items()))
    try:
        records = case.read(path)
    except Exception as err:  # noqa: BLE001 - judging every exception is the point
        message = str(err) if isinstance(err, (ValueError, FileNotFoundError)) else f"{type(err).__name__}: {err}"
        return Outcome(case_name, mutation_name, key, _verdict(case, path, err), message)
    at_line_end = mutation_name == "truncate" and 0 < params["at"] and valid[params["at"] - 1:params["at"]] == b"\n"
    if (case.line_oriented and at_line_end) or repr(records) == valid_records \
            or case.undetectable(mutation_name, params, valid):
        return Outcome(case_name, mutation_name, key, "undetectable", f"read {len(records)} records")
    message = f"read {len(records)} records, the valid file has other ones"
    return Outcome(case_name, mutation_name, key, "silent", message)


def run(examples_per_pair: int, seed: int) -> list[Outcome]:
    """:func:`check` of ``examples_per_pair`` damages of every (case, mutation) pair, parameters drawn from
    ``random.Random(seed)``."""
    rng = random.Random(seed)
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        for case_name, case in CASES.items():
            for mutation_name in case.mutations:
                outcomes += [check(case_name, mutation_name, rng, tmp) for _ in range(examples_per_pair)]
    return outcomes


def summary(outcomes: Sequence[Outcome]) -> dict[str, dict[str, int]]:
    """Counts per reader and verdict."""
    counts: dict[str, Counter[str]] = {}
    for outcome in outcomes:
        counts.setdefault(outcome.reader, Counter())[outcome.verdict] += 1
    return {reader: {v: c[v] for v in VERDICTS if c[v]} for reader, c in counts.items()}
