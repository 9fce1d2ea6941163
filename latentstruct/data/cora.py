"""Cora citation field extraction (Seymore et al. 1999; ParsCit's copy; seed 004 Table 4, after Rooshenas et al.
2019): the two readers, the semi-supervised splits and padded id tensors for
:class:`latentstruct.tasks.energy_citation.CitationEnergy`.

* :func:`read_cora_tagged` (``cora.tagged.txt``, inline ``<field> ... </field>`` spans), :func:`read_cora_columns`
  (ParsCit's 24-column ``cora.train``), :func:`load_cora`: the same 500 citations, 11,604 tokens, one of the 13
  :data:`CORA_FIELDS` per token (counts checked by :func:`check_counts`).
* :func:`cora_splits`: permuted by ``split_seed``, then test 100, valid 100, a labelled pool of 50 (``labelled`` = 5,
  10, 50 take its first ones, nested) and the 250 unlabelled rest (the paper has 1,000 more unlabelled citations).
* :func:`cora_dataset`: per split ``x`` ``[N, n]`` word ids (pad 0), ``lengths`` ``[N]``, ``y`` ``[N, n]`` field ids
  (pad ``TAG_PAD``; all ``TAG_PAD`` for an unlabelled citation: its gold fields never reach the model), ``cues``
  ``[N, n, P]`` (:func:`latentstruct.data.citation_rules.token_cues`) and ``labelled`` ``[N]``;
  ``extras["metric"] = "token_acc"``.

File formats, the split protocol and how it differs from the paper's, balancing and word normalisation:
docs/data.md#cora.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Annotated, NamedTuple

import torch

from latentstruct.data.base import TensorSplits
from latentstruct.data.citation_rules import CUES, FIELDS, token_cues
from latentstruct.data.conll import TAG_PAD, pad_ids
from latentstruct.data.files import first_file, read_lines
from latentstruct.data.text import Vocab
from latentstruct.ranges import AtLeast, NonNegative

__all__ = [
    "CORA_CITATIONS",
    "CORA_FIELDS",
    "CORA_FIELD_TOKENS",
    "CORA_TOKENS",
    "Citation",
    "cora_dataset",
    "cora_splits",
    "load_cora",
    "normalize_word",
    "read_cora_columns",
    "read_cora_tagged",
]

#: the 13 fields, in the order of the issue (tag id = index)
CORA_FIELDS: tuple[str, ...] = FIELDS
#: the shared copy's counts (MANIFEST.md §9)
CORA_CITATIONS = 500
CORA_TOKENS = 11604
CORA_FIELD_TOKENS: dict[str, int] = {"title": 3557, "author": 2831, "booktitle": 1862, "date": 642, "journal": 614,
                                     "pages": 438, "institution": 306, "editor": 295, "location": 289, "volume": 269,
                                     "publisher": 203, "tech": 176, "note": 122}
#: test, valid, labelled pool; the rest is unlabelled
SPLIT_SIZES: dict[str, int] = {"test": 100, "valid": 100, "pool": 50}

_FIELD_SET = frozenset(CORA_FIELDS)
_TAG = re.compile(r"<(/?)([^<>\s]*)>")


class Citation(NamedTuple):
    """One citation: its tokens and their fields (equally long lists of strings)."""

    tokens: list[str]
    tags: list[str]


def _parse_tagged(line: str, where: str) -> Citation:
    """One line of the inline-tagged format (``where``: ``file:line`` for the errors)."""
    tokens: list[str] = []
    tags: list[str] = []
    field, pos = None, 0

    def words(text: str, inside: str | None) -> None:
        if "<" in text or ">" in text:
            raise ValueError(f"{where}: a '<' or '>' outside a field tag: {text.strip()[:40]!r}")
        if inside is not None:
            for word in text.split():
                tokens.append(word)
                tags.append(inside)

    for match in _TAG.finditer(line):
        words(line[pos:match.start()], field)
        closing, name = match.group(1) == "/", match.group(2)
        if name not in _FIELD_SET:
            raise ValueError(f"{where}: unknown field <{match.group(1)}{name}> (the fields: {', '.join(CORA_FIELDS)})")
        if closing:
            if field != name:
                raise ValueError(f"{where}: </{name}> closes {'no field' if field is None else f'<{field}>'}")
            field = None
        elif field is not None:
            raise ValueError(f"{where}: <{name}> opens inside <{field}> (fields never nest)")
        else:
            field = name
        pos = match.end()
    words(line[pos:], field)
    if field is not None:
        raise ValueError(f"{where}: <{field}> is never closed (a line cut short?)")
    if not tokens:
        raise ValueError(f"{where}: a citation without a token in a field")
    return Citation(tokens, tags)


def read_cora_tagged(path: str | Path) -> list[Citation]:
    """The citations of an inline-tagged file, one per non-blank line (docs/data.md#cora)."""
    citations = [_parse_tagged(line, f"{path}:{lineno}") for lineno, line in read_lines(path) if line.strip()]
    if not citations:
        raise ValueError(f"{path}: no citation")
    return citations


def read_cora_columns(path: str | Path) -> list[Citation]:
    """The citations of ParsCit's CRF++ file (24 columns: token, 22 features, field; blank line between citations)."""
    citations: list[Citation] = []
    tokens: list[str] = []
    tags: list[str] = []
    for lineno, line in read_lines(path):
        fields = line.split()
        if not fields:
            if tokens:
                citations.append(Citation(tokens, tags))
                tokens, tags = [], []
            continue
        if len(fields) != 24:
            raise ValueError(f"{path}:{lineno}: expected 24 columns (token, 22 features, field), got {len(fields)}")
        if fields[-1] not in _FIELD_SET:
            raise ValueError(f"{path}:{lineno}: field {fields[-1]!r} is not one of {', '.join(CORA_FIELDS)}")
        tokens.append(fields[0])
        tags.append(fields[-1])
    if tokens:
        citations.append(Citation(tokens, tags))
    if not citations:
        raise ValueError(f"{path}: no citation")
    return citations


def load_cora(root: str | Path, source: str = "tagged") -> list[Citation]:
    """The citations of ``root`` from ``cora.tagged.txt`` (``source="tagged"``) or ``cora.train`` (``"columns"``),
    each plain or ``.gz``."""
    name, reader = {"tagged": ("cora.tagged.txt", read_cora_tagged), "columns": ("cora.train", read_cora_columns)}[
        source]
    path = first_file([Path(root) / name, Path(root) / f"{name}.gz"])
    if path is None:
        raise FileNotFoundError(f"missing {Path(root) / name}[.gz]: the Cora folder holds cora.tagged.txt (inline "
                                "tags) or cora.train (CRF++ columns), ParsCit's copies (see MANIFEST.md §9)")
    return reader(path)


def check_counts(citations: list[Citation], where: str) -> None:
    """Refuse citations whose counts are not the shared copy's (:data:`CORA_FIELD_TOKENS`)."""
    counts = {f: 0 for f in CORA_FIELDS}
    for c in citations:
        for tag in c.tags:
            counts[tag] += 1
    got = (len(citations), sum(counts.values()), counts)
    if got != (CORA_CITATIONS, CORA_TOKENS, CORA_FIELD_TOKENS):
        raise ValueError(f"{where}: {got[0]} citations, {got[1]} tokens, per field {counts}; expected the shared "
                         f"copy's {CORA_CITATIONS}, {CORA_TOKENS}, {CORA_FIELD_TOKENS} (dataset.check_sizes=false "
                         "reads other files)")


def cora_splits(n: int, labelled: int, unlabelled: int | None = None, split_seed: int = 0,
                sizes: dict[str, int] = SPLIT_SIZES) -> dict[str, list[int]]:
    """Citation indices of test, valid, labelled, unlabelled (docs/data.md#cora); the labelled pools are nested."""
    order = list(range(n))
    random.Random(split_seed).shuffle(order)
    a, b, c = sizes["test"], sizes["test"] + sizes["valid"], sizes["test"] + sizes["valid"] + sizes["pool"]
    if labelled > sizes["pool"]:
        raise ValueError(f"labelled = {labelled} is more than the labelled pool ({sizes['pool']})")
    if c >= n:
        raise ValueError(f"{n} citations leave none unlabelled after {sizes}")
    rest = order[c:]
    return {"test": order[:a], "valid": order[a:b], "labelled": order[b:b + labelled],
            "unlabelled": rest if unlabelled is None else rest[:unlabelled]}


def normalize_word(word: str) -> str:
    """Lower case, every digit 0."""
    return re.sub(r"\d", "0", word.lower())


def cora_dataset(
    data_dir: str | Path,
    folder: str = "cora",
    source: str = "tagged",
    labelled: Annotated[int, AtLeast(1)] = 10,
    unlabelled: Annotated[int | None, NonNegative] = None,
    balance: bool = True,
    split_seed: int = 0,
    normalize: bool = True,
    check_sizes: bool = True,
    n_test: Annotated[int, AtLeast(1)] = 100,
    n_valid: Annotated[int, AtLeast(1)] = 100,
    pool: Annotated[int, AtLeast(1)] = 50,
) -> TensorSplits:
    """Cora as :class:`~latentstruct.data.base.TensorSplits` (docs/data.md#cora): train (labelled, repeated when
    ``balance``, then unlabelled), valid, test; ``dims`` = ``vocab_size``, ``num_tags`` (13), ``num_cues``;
    ``extras`` = ``vocab``, ``tag_names``, ``metric`` (``token_acc``), ``embeddings`` (None), ``citations`` (the
    train split's (tokens, tags) rows, unlabelled ones with tags None), ``split`` (the citation indices).

    Args:
        data_dir: root of the real datasets.
        folder: the Cora folder (cora.tagged.txt or cora.train, plain or .gz), relative to data_dir unless absolute.
        source: tagged (cora.tagged.txt, inline tags) or columns (cora.train, CRF++ columns); the same citations.
        labelled: labelled training citations (seed 004 Table 4: 5, 10, 50), the first of the fixed pool.
        unlabelled: unlabelled training citations (the paper: 1,000; here at most 250); null = all 250.
        balance: repeat the labelled citations to about as many rows as the unlabelled ones.
        split_seed: seed of the permutation that makes the splits.
        normalize: words lower-cased with digits mapped to 0.
        check_sizes: refuse files whose counts are not the shared copy's (500 citations, 11,604 tokens, per field).
        n_test: test citations (our protocol: 100).
        n_valid: validation citations (100).
        pool: the labelled pool (50), of which the first ``labelled`` are used.
    """
    root = Path(folder).expanduser()
    root = root if root.is_absolute() else Path(data_dir) / root
    if source not in ("tagged", "columns"):
        raise ValueError(f"source must be 'tagged' or 'columns', got {source!r}")
    citations = load_cora(root, source)
    if check_sizes:
        check_counts(citations, str(root))
    sizes = {"test": n_test, "valid": n_valid, "pool": pool}
    index = cora_splits(len(citations), labelled, unlabelled, split_seed, sizes)
    copies = max(1, round(len(index["unlabelled"]) / max(labelled, 1))) if balance else 1
    rows = {
        "train": [(i, True) for i in index["labelled"]] * copies + [(i, False) for i in index["unlabelled"]],
        "valid": [(i, True) for i in index["valid"]],
        "test": [(i, True) for i in index["test"]],
    }

    def words(c: Citation) -> list[str]:
        return [normalize_word(w) for w in c.tokens] if normalize else c.tokens

    vocab = Vocab.build(words(citations[i]) for i, _ in rows["train"])
    tag_index = {f: k for k, f in enumerate(CORA_FIELDS)}
    splits = {}
    for name, chosen in rows.items():
        cites = [citations[i] for i, _ in chosen]
        width = max(len(c.tokens) for c in cites)
        cues = torch.zeros(len(cites), width, len(CUES))
        for k, c in enumerate(cites):
            cues[k, : len(c.tokens)] = token_cues(c.tokens)
        splits[name] = {
            "x": pad_ids([vocab.encode(words(c)) for c in cites], 0),
            "lengths": torch.tensor([len(c.tokens) for c in cites], dtype=torch.long),
            "y": pad_ids([[tag_index[t] for t in c.tags] if lab else [TAG_PAD] * len(c.tags)
                          for c, (_, lab) in zip(cites, chosen, strict=True)], TAG_PAD),
            "cues": cues,
            "labelled": torch.tensor([float(lab) for _, lab in chosen]),
        }
    dims = {"vocab_size": len(vocab), "num_tags": len(CORA_FIELDS), "num_cues": len(CUES), "embedding_dim": 0}
    extras = {"vocab": vocab, "tag_names": list(CORA_FIELDS), "metric": "token_acc", "embeddings": None,
              "embedding_source": "random (trainable)", "split": index,
              "citations": [(citations[i].tokens, citations[i].tags if lab else None) for i, lab in rows["train"]]}
    return TensorSplits(splits, dims=dims, extras=extras)
