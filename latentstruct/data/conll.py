"""CoNLL-2003 English NER: the column reader, IOB2 ↔ BIOES, conlleval's chunks and F1, and padded id tensors.

* :func:`read_conll` (``token POS chunk NER`` per line, blank line between sentences, ``-DOCSTART-`` skipped),
  :func:`load_conll` (``data_dir/conll2003/{train,valid,test}.txt[.gz]``; sizes :data:`CONLL_SIZES`).
* :func:`iob2_to_bioes`, :func:`bioes_to_iob2` (well-formed input required unless ``repair=True``, which reads it as
  conlleval does and so converts IOB1); :func:`spans` → ``(type, start, end)`` chunks, ``end`` exclusive;
  :func:`span_f1`: conlleval's precision, recall and FB1 (×100).
* :func:`tag_names`: ``O`` = 0, then the ``B I E S`` (BIOES, 17 tags) or ``B I`` (IOB2, 9 tags) of each of
  :data:`CONLL_TYPES`.
* :func:`conll_dataset`: per split, word (and with ``features`` POS and chunk) ids ``[N, n]`` padded with 0,
  ``lengths`` ``[N]`` and tag ids ``[N, n]`` padded with :data:`TAG_PAD` = -100 (mask past ``lengths``).

Example::

    >>> iob2_to_bioes(["B-PER", "I-PER", "O", "B-LOC"])
    ['B-PER', 'E-PER', 'O', 'S-LOC']
    >>> spans(["B-PER", "I-PER", "O", "B-LOC"])
    [('PER', 0, 2), ('LOC', 3, 4)]

The file format, the validation choice, conlleval's chunk rules (and where BIOES needs more): docs/data.md#conll.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import numpy as np
import torch

from latentstruct.data.base import TensorSplits
from latentstruct.data.files import first_file, read_lines
from latentstruct.data.text import Vocab, glove_cache
from latentstruct.ranges import NonNegative

__all__ = [
    "CONLL_SIZES",
    "CONLL_TYPES",
    "TAG_PAD",
    "Sentence",
    "bioes_to_iob2",
    "conll_dataset",
    "iob2_to_bioes",
    "load_conll",
    "pad_ids",
    "read_conll",
    "sample_subset",
    "span_f1",
    "spans",
    "tag_names",
    "tags_from_spans",
    "word_vectors",
]

#: the four CoNLL-2003 entity types
CONLL_TYPES: tuple[str, ...] = ("LOC", "MISC", "ORG", "PER")

#: the padding value of the tag tensors
TAG_PAD = -100

#: published (sentences, tokens) of the English CoNLL-2003 splits, -DOCSTART- lines excluded
CONLL_SIZES: dict[str, tuple[int, int]] = {"train": (14041, 203621), "valid": (3250, 51362), "test": (3453, 46435)}

_SCHEME_PREFIXES = {"iob2": "BI", "bioes": "BIES"}


class Sentence(NamedTuple):
    """One sentence: the four columns, each a list of strings of the same length."""

    tokens: list[str]
    pos: list[str]
    chunk: list[str]
    ner: list[str]


# --- files ---------------------------------------------------------------------------------------------------------


def read_conll(path: str | Path) -> list[Sentence]:
    """Read a 4-column CoNLL-2003 file (plain or compressed) into sentences; ``-DOCSTART-`` lines are skipped.

    The official files end without a newline, so a last line cut mid-line is found by its content (too few columns,
    a cut NER tag), not by a missing line end."""
    sentences: list[Sentence] = []
    rows: list[list[str]] = []  # the fields of the current sentence's lines

    def flush() -> None:
        if rows:
            sentences.append(Sentence(*(list(column) for column in zip(*rows, strict=True))))
            rows.clear()

    for lineno, line in read_lines(path, final_newline=False):
        fields = line.split()
        if len(fields) == 4 and fields[0] != "-DOCSTART-":
            if not _is_conll_tag(fields[3]):
                raise ValueError(
                    f"{path}:{lineno}: NER tag {fields[3]!r} is not O or B-, I-, E-, S- followed by one of "
                    f"{', '.join(CONLL_TYPES)}"
                )
            rows.append(fields)
        elif not fields or (len(fields) == 4 and fields[0] == "-DOCSTART-"):
            flush()
        else:
            raise ValueError(f"{path}:{lineno}: expected 4 columns (token POS chunk NER), got {len(fields)}")
    flush()
    if not sentences:
        raise ValueError(f"{path}: no sentence (a CoNLL file holds token lines of 4 columns)")
    return sentences


def _is_conll_tag(tag: str) -> bool:
    prefix, sep, kind = tag.partition("-")
    return tag == "O" or (sep == "-" and prefix in ("B", "I", "E", "S") and kind in CONLL_TYPES)


def load_conll(root: str | Path) -> dict[str, list[Sentence]]:
    """Read ``train``, ``valid`` and ``test`` (``<split>.txt`` or ``<split>.txt.gz``) from ``root``."""
    root = Path(root)
    out = {}
    for split in ("train", "valid", "test"):
        path = first_file([root / f"{split}.txt", root / f"{split}.txt.gz"])
        if path is None:
            raise FileNotFoundError(
                f"missing {root / split}.txt[.gz]; a CoNLL-2003 folder must hold train.txt, valid.txt and test.txt "
                "(plain or .gz) in the 4-column format (token POS chunk NER)"
            )
        out[split] = read_conll(path)
    return out


# --- tags and chunks -----------------------------------------------------------------------------------------------


def _split_tag(tag: str) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if not sep or not kind or prefix not in ("B", "I", "E", "S"):
        raise ValueError(f"not a chunk tag: {tag!r} (expected 'O' or B-, I-, E-, S- followed by a type)")
    return prefix, kind


def _ends(p: str, q: str, t: str, u: str) -> bool:
    """Whether the chunk holding the previous tag (prefix ``p``, type ``t``) ends before the tag ``q``, ``u``."""
    return p in "ES" or (p in "BI" and q in "BSO") or (p != "O" and t != u)


def _starts(p: str, q: str, t: str, u: str) -> bool:
    """Whether a chunk starts at the tag ``q``, ``u`` after the tag ``p``, ``t``."""
    return q in "BS" or (q in "IE" and p in "OES") or (q != "O" and t != u)


def spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The chunks ``(type, start, end)`` (``end`` exclusive) of a tag sequence, read by conlleval's rules (module
    docstring); any mix of B/I/E/S/O prefixes is accepted."""
    out = []
    start = None
    p, t = "O", ""
    for i, tag in enumerate([*tags, "O"]):
        q, u = _split_tag(tag)
        if start is not None and _ends(p, q, t, u):
            out.append((t, start, i))
            start = None
        if _starts(p, q, t, u):
            start = i
        p, t = q, u
    return out


def tags_from_spans(chunks: Iterable[tuple[str, int, int]], length: int, scheme: str = "bioes") -> list[str]:
    """The ``scheme`` (``"bioes"`` or ``"iob2"``) tags of ``length`` tokens holding the (non-overlapping) chunks
    ``(type, start, end)``, ``end`` exclusive; the other tokens are ``O``."""
    if scheme not in _SCHEME_PREFIXES:
        raise ValueError(f"unknown tagging scheme {scheme!r} (expected one of {', '.join(_SCHEME_PREFIXES)})")
    tags = ["O"] * length
    for kind, start, end in chunks:
        if not 0 <= start < end <= length or any(tag != "O" for tag in tags[start:end]):
            raise ValueError(f"chunk ({kind!r}, {start}, {end}) is empty, out of 0..{length} or overlaps another")
        tags[start:end] = [f"I-{kind}"] * (end - start)
        tags[start] = f"B-{kind}"
        if scheme == "bioes":
            tags[end - 1] = f"E-{kind}" if end - start > 1 else f"S-{kind}"
    return tags


def _convert(tags: Sequence[str], source: str, target: str, repair: bool) -> list[str]:
    tags = list(tags)
    allowed = _SCHEME_PREFIXES[source]
    for i, tag in enumerate(tags):
        prefix, _ = _split_tag(tag)
        if prefix != "O" and prefix not in allowed:
            raise ValueError(f"tag {tag!r} at position {i} is not allowed in {source.upper()}")
    chunks = spans(tags)
    if not repair:
        canonical = tags_from_spans(chunks, len(tags), source)
        if canonical != tags:
            i = next(i for i, (a, b) in enumerate(zip(tags, canonical, strict=True)) if a != b)
            before = repr(tags[i - 1]) if i else "the start"
            raise ValueError(
                f"ill-formed {source.upper()}: {tags[i]!r} at position {i} after {before} (conlleval reads it as "
                f"{canonical[i]!r}; pass repair=True to accept that reading)"
            )
    return tags_from_spans(chunks, len(tags), target)


def iob2_to_bioes(tags: Sequence[str], repair: bool = False) -> list[str]:
    """IOB2 → BIOES. Ill-formed IOB2 raises ``ValueError`` unless ``repair``, which reads it as conlleval does (and
    so converts IOB1 correctly)."""
    return _convert(tags, "iob2", "bioes", repair)


def bioes_to_iob2(tags: Sequence[str], repair: bool = False) -> list[str]:
    """BIOES → IOB2 (``E`` → ``I``, ``S`` → ``B``). Ill-formed BIOES raises ``ValueError`` unless ``repair``, which
    converts conlleval's reading of it."""
    return _convert(tags, "bioes", "iob2", repair)


def span_f1(
    pred_seqs: Sequence[Sequence[str]], gold_seqs: Sequence[Sequence[str]]
) -> tuple[float, float, float]:
    """conlleval's chunk precision, recall and F1 (×100, micro over all chunks) of predicted against gold tag
    sequences (any B/I/E/S/O mix, read by :func:`spans`)."""
    if len(pred_seqs) != len(gold_seqs):
        raise ValueError(f"{len(pred_seqs)} predicted sequences but {len(gold_seqs)} gold ones")
    correct = found_pred = found_gold = 0
    for i, (pred, gold) in enumerate(zip(pred_seqs, gold_seqs, strict=True)):
        if len(pred) != len(gold):
            raise ValueError(f"sequence {i}: {len(pred)} predicted tags but {len(gold)} gold ones")
        pred_chunks, gold_chunks = set(spans(pred)), set(spans(gold))
        correct += len(pred_chunks & gold_chunks)
        found_pred += len(pred_chunks)
        found_gold += len(gold_chunks)
    precision = 100.0 * correct / found_pred if found_pred else 0.0
    recall = 100.0 * correct / found_gold if found_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def tag_names(scheme: str = "bioes", types: Sequence[str] = CONLL_TYPES) -> list[str]:
    """The tag inventory: ``O``, then per type ``B I E S`` (BIOES) or ``B I`` (IOB2)."""
    if scheme not in _SCHEME_PREFIXES:
        raise ValueError(f"unknown tagging scheme {scheme!r} (expected one of {', '.join(_SCHEME_PREFIXES)})")
    return ["O", *(f"{prefix}-{kind}" for kind in types for prefix in _SCHEME_PREFIXES[scheme])]


# --- dataset for train.py ------------------------------------------------------------------------------------------


def pad_ids(seqs: list[list[int]], pad: int) -> torch.Tensor:
    """int64 ``[N, max_len]``, right-padded with ``pad``."""
    out = np.full((len(seqs), max((len(s) for s in seqs), default=0)), pad, dtype=np.int64)
    for i, seq in enumerate(seqs):
        out[i, : len(seq)] = seq
    return torch.from_numpy(out)


def sample_subset(sentences: list, n: int | None) -> list:
    """``n`` sentences drawn without replacement by a fixed seed, kept in file order (smoke runs)."""
    if n is None or n >= len(sentences):
        return sentences
    if n < 0:
        raise ValueError(f"a subset size must be non-negative, got {n}")
    return [sentences[i] for i in sorted(random.Random(0).sample(range(len(sentences)), n))]


def word_vectors(
    pretrained: str | None, data_dir: str | Path, vocab: Vocab, cache_dir: str
) -> tuple[torch.Tensor | None, str]:
    """(GloVe rows for ``vocab`` read from ``pretrained`` — a path relative to ``data_dir`` unless absolute — or None
    without ``pretrained``, and a line saying where the vectors came from)."""
    if not pretrained:
        return None, "random (trainable)"
    path = Path(pretrained).expanduser()
    path = path if path.is_absolute() else Path(data_dir) / path
    if not path.is_file():
        raise FileNotFoundError(f"pretrained={pretrained!r}: no file {path}")
    embeddings = glove_cache(path, vocab, cache_dir)
    found = int((embeddings.abs().sum(1) > 0).sum())
    return embeddings, f"{path.name} ({found} of {len(vocab) - 2} words)"


def conll_dataset(
    data_dir: str | Path,
    folder: str = "conll2003",
    scheme: Literal["bioes", "iob2"] = "bioes",
    min_count: int = 1,
    lowercase: bool = False,
    features: bool = False,
    repair_tags: bool = False,
    pretrained: str | None = None,
    cache_dir: str = ".cache/glove",
    subset: Annotated[int | None, NonNegative] = None,
    eval_subset: Annotated[int | None, NonNegative] = None,
) -> TensorSplits:
    """CoNLL-2003 as :class:`~latentstruct.data.base.TensorSplits`: each split ``{"x": int64 [N, n] word ids (pad 0),
    "lengths": int64 [N], "y": int64 [N, n] tag ids (pad -100)}``, plus ``"pos"`` and ``"chunk"`` int64 ``[N, n]`` (pad
    0) with ``features``. ``dims`` = ``vocab_size``, ``num_tags``, ``embedding_dim`` (0 without ``pretrained``),
    ``pos_vocab_size`` and ``chunk_vocab_size`` (0 without ``features``); ``extras`` = ``vocab``, ``tag_names``,
    ``pos_vocab``, ``chunk_vocab`` (None without ``features``), ``embeddings`` (a GloVe matrix for ``vocab`` or
    None) and ``embedding_source``. Tags are converted from the files' IOB2 to ``scheme`` (``repair_tags``: see
    :func:`iob2_to_bioes`). ``subset`` / ``eval_subset`` keep that many sentences of train / valid and test.

    Args:
        data_dir: root of the real datasets.
        folder: the CoNLL-2003 folder (train/valid/test.txt[.gz], 4 columns: token POS chunk NER), relative to
            data_dir unless absolute.
        scheme: tagging scheme of the model's tags: bioes (17 tags) or iob2 (9); the files are IOB2.
        min_count: words seen fewer times in train map to <unk>.
        features: also give the POS and chunk columns as per-token ids (seed 004's NER+).
        repair_tags: read ill-formed IOB2 (or IOB1 files) as conlleval does instead of refusing it.
        lowercase: set through embedding.lowercase.
        pretrained: set through embedding.pretrained.
        cache_dir: set through embedding.cache_dir.
        subset: keep this many training examples, drawn by a fixed seed (smoke runs); null = all.
        eval_subset: keep this many valid / test examples, drawn likewise; null = all.
    """
    root = Path(folder).expanduser()
    root = root if root.is_absolute() else Path(data_dir) / root
    raw = load_conll(root)
    raw = {split: sample_subset(data, subset if split == "train" else eval_subset) for split, data in raw.items()}
    names = tag_names(scheme)
    tag_index = {tag: i for i, tag in enumerate(names)}

    def words(sentence: Sentence) -> list[str]:
        return [w.lower() for w in sentence.tokens] if lowercase else sentence.tokens

    vocab = Vocab.build((words(s) for s in raw["train"]), min_freq=min_count)
    pos_vocab = Vocab.build(s.pos for s in raw["train"]) if features else None
    chunk_vocab = Vocab.build(s.chunk for s in raw["train"]) if features else None
    embeddings, source = word_vectors(pretrained, data_dir, vocab, cache_dir)

    splits = {}
    for split, sentences in raw.items():
        tag_ids = []
        for k, sentence in enumerate(sentences):
            try:
                tags = iob2_to_bioes(sentence.ner, repair_tags)  # also checks (or repairs) the IOB2
                if scheme == "iob2":
                    tags = bioes_to_iob2(tags)
                tag_ids.append([tag_index[tag] for tag in tags])
            except (KeyError, ValueError) as err:
                raise ValueError(f"{split} sentence {k} ({' '.join(sentence.tokens[:8])} ...): {err}") from None
        data = {
            "x": pad_ids([vocab.encode(words(s)) for s in sentences], 0),
            "lengths": torch.tensor([len(s.tokens) for s in sentences], dtype=torch.long),
            "y": pad_ids(tag_ids, TAG_PAD),
        }
        if features:
            data["pos"] = pad_ids([pos_vocab.encode(s.pos) for s in sentences], 0)
            data["chunk"] = pad_ids([chunk_vocab.encode(s.chunk) for s in sentences], 0)
        splits[split] = data
    dims = {
        "vocab_size": len(vocab),
        "num_tags": len(names),
        "embedding_dim": 0 if embeddings is None else embeddings.shape[1],
        "pos_vocab_size": len(pos_vocab) if pos_vocab else 0,
        "chunk_vocab_size": len(chunk_vocab) if chunk_vocab else 0,
    }
    extras = {"vocab": vocab, "tag_names": names, "pos_vocab": pos_vocab, "chunk_vocab": chunk_vocab,
              "embeddings": embeddings, "embedding_source": source}
    return TensorSplits(splits, dims=dims, extras=extras)
