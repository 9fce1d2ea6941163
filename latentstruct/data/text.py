"""Readers for the text datasets (SST, SNLI 1.0), a vocabulary, GloVe vectors and padded id batches.

* SST: :func:`parse_ptb_tree` (one binarised PTB s-expression → root label, tokens), :func:`read_sst`,
  :func:`load_sst` (``train.txt`` / ``dev.txt`` / ``test.txt`` → train / valid / test); binary task: labels 0, 1 → 0,
  3, 4 → 1, neutral dropped (6920 / 872 / 1821 sentences, enforced with ``check_sizes``).
* SNLI 1.0: :func:`read_snli_jsonl`, :func:`read_snli_tsv`, :func:`load_snli`; labels :data:`SNLI_LABELS`
  (entailment 0, neutral 1, contradiction 2); pairs without a gold label, empty or longer than ``max_tokens`` dropped.
* :func:`tokenize`: a regular-expression approximation of Penn Treebank tokenisation.
* :class:`Vocab` (``<pad>`` = 0, ``<unk>`` = 1, then by count, then alphabetically), :func:`read_glove`,
  :func:`glove_cache`; :func:`pad_batch`: int64 ids ``[B, max_len]`` and ``lengths`` ``[B]``.
* :func:`sst_dataset`, :func:`snli_dataset`: the ``TensorSplits`` the tasks train on.

Every file is opened through :mod:`latentstruct.data.files` (compression by magic bytes, strict UTF-8, a file cut
mid-line refused with one line naming it).

Example::

    >>> tokenize("It's a U.S. t-shirt, isn't it?")
    ['It', "'s", 'a', 'U.S.', 't-shirt', ',', 'is', "n't", 'it', '?']
    >>> pad_batch([[4, 5, 6], [7]])
    (tensor([[4, 5, 6],
            [7, 0, 0]]), tensor([3, 1]))

Formats, what is refused, the tokeniser's rules and known differences from PTB, GloVe parsing, the cache key:
docs/data.md#text.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated

import torch

from latentstruct.data.base import TensorSplits
from latentstruct.data.files import first_file, read_lines
from latentstruct.ranges import AtLeast, NonNegative

__all__ = [
    "SNLI_LABELS",
    "SST_BINARY_SIZES",
    "Vocab",
    "snli_dataset",
    "sst_dataset",
    "glove_cache",
    "load_snli",
    "load_sst",
    "pad_batch",
    "parse_ptb_tree",
    "read_glove",
    "read_snli_jsonl",
    "read_snli_tsv",
    "read_sst",
    "tokenize",
]

SNLI_LABELS: dict[str, int] = {"entailment": 0, "neutral": 1, "contradiction": 2}

#: binary-task sentence counts of the official SST train / dev / test files
SST_BINARY_SIZES: dict[str, int] = {"train": 6920, "valid": 872, "test": 1821}

_SPLIT_NAMES = {"train": "train", "dev": "valid", "test": "test"}

# --- files ---------------------------------------------------------------------------------------------------------


# --- SST -----------------------------------------------------------------------------------------------------------

_PTB_TOKEN = re.compile(r"\(|\)|[^ \t\r\n\f\v()]+")


def _tree_error(reason: str, line: str) -> ValueError:
    prefix = line if len(line) <= 80 else line[:80] + "..."
    return ValueError(f"{reason} in tree {prefix!r}")


def parse_ptb_tree(line: str) -> tuple[int, list[str]]:
    """Parse one labelled PTB s-expression; return the root label and the leaves (tokens as written)."""
    tokens = _PTB_TOKEN.findall(line)
    if not tokens or tokens[0] != "(":
        raise _tree_error("a tree must start with '('", line)
    root_label: int | None = None
    leaves: list[str] = []
    stack: list[str | None] = []  # per open node: None (no child yet), "leaf" or "tree"
    closed = False
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if closed:
            raise _tree_error(f"text {tok!r} after the root tree closed", line)
        if tok == "(":
            if stack and stack[-1] == "leaf":
                raise _tree_error("a node mixes a token with subtrees", line)
            i += 1
            if i == len(tokens) or tokens[i] in "()":
                raise _tree_error("missing label after '('", line)
            try:
                label = int(tokens[i])
            except ValueError:
                raise _tree_error(f"non-integer label {tokens[i]!r}", line) from None
            if stack:
                stack[-1] = "tree"
            else:
                root_label = label
            stack.append(None)
        elif tok == ")":
            if not stack:
                raise _tree_error("unbalanced brackets (too many ')')", line)
            if stack.pop() is None:
                raise _tree_error("empty node", line)
            closed = not stack
        else:
            if stack[-1] == "tree":
                raise _tree_error(f"a node mixes subtrees with the token {tok!r}", line)
            if stack[-1] == "leaf":
                raise _tree_error(f"a pre-terminal holds more than one token ({tok!r})", line)
            stack[-1] = "leaf"
            leaves.append(tok)
        i += 1
    if stack:
        raise _tree_error(f"unbalanced brackets ({len(stack)} unclosed '(')", line)
    assert root_label is not None
    return root_label, leaves


def read_sst(path: str | Path, binary: bool = True) -> list[tuple[list[str], int]]:
    """Read an SST tree file (plain or compressed): ``[(tokens, label)]`` for every sentence, binary (0/1, neutral
    dropped) or fine-grained (0-4)."""
    out: list[tuple[list[str], int]] = []
    for lineno, line in read_lines(path):
        line = line.strip()
        if not line:
            continue
        try:
            label, tokens = parse_ptb_tree(line)
        except ValueError as err:
            raise ValueError(f"{path}:{lineno}: {err}") from None
        if not 0 <= label <= 4:
            raise ValueError(f"{path}:{lineno}: root label {label} outside 0..4")
        if binary:
            if label == 2:
                continue
            label = int(label > 2)
        out.append((tokens, label))
    return out


def load_sst(root: str | Path, binary: bool = True, check_sizes: bool = True) -> dict[str, list[tuple[list[str], int]]]:
    """Read ``train.txt``, ``dev.txt``, ``test.txt`` (each optionally ``.gz``) from ``root`` as splits train / valid /
    test; with ``binary`` and ``check_sizes`` the official sizes 6920 / 872 / 1821 are enforced."""
    root = Path(root)
    out = {}
    for file_split, split in _SPLIT_NAMES.items():
        path = first_file([root / f"{file_split}.txt", root / f"{file_split}.txt.gz"])
        if path is None:
            raise FileNotFoundError(
                f"missing {file_split}.txt[.gz] in {root}; an SST folder must hold train.txt, dev.txt and test.txt "
                "(optionally gzipped), the PTB trees of trainDevTestTrees_PTB.zip"
            )
        out[split] = read_sst(path, binary=binary)
    if binary and check_sizes:
        sizes = {split: len(data) for split, data in out.items()}
        if sizes != SST_BINARY_SIZES:
            raise ValueError(
                f"{root}: binary SST sizes {sizes} differ from the official {SST_BINARY_SIZES}; the files are not the "
                "standard SST trees (pass check_sizes=False to read them anyway)"
            )
    return out


# --- tokenizer -----------------------------------------------------------------------------------------------------

_CLITICS = r"(?:s|re|ll|ve|m|d)\b"
_APOS = "['’]"
_WORD = r"[^\W_]+"
_TOKEN_RE = re.compile(
    "|".join(
        [
            rf"{_WORD}(?=n{_APOS}t\b)",  # stem of a negated contraction: do|n't
            rf"n{_APOS}t\b",  # the clitic n't
            r"can(?=not\b)",  # can|not
            rf"{_APOS}{_CLITICS}",  # 's 're 'll 've 'm 'd
            r"(?:[^\W\d_]\.){2,}",  # U.S., J.R.R.
            r"(?:Mrs|Mr|Ms|Dr|Prof|Jr|Sr|St|vs)\.",  # titles
            r"\d+(?:[.,]\d+)+",  # 3.5, 1,000.25
            rf"{_WORD}(?:(?:-|{_APOS}(?!{_CLITICS})){_WORD})*",  # words, t-shirt, o'clock
            r"\.{2,}|-{2,}",  # ... and --
            r"\S",  # any other character
        ]
    ),
    re.IGNORECASE,
)
_OPENERS = " \t\n\r([{<"
_CURLY_QUOTES = {"“": "``", "”": "''"}


def tokenize(text: str) -> list[str]:
    """Split raw English text into PTB-style tokens (docs/data.md#text: the rules); case is kept."""
    tokens = []
    for match in _TOKEN_RE.finditer(text):
        tok = match.group()
        if tok == '"':
            start = match.start()
            tok = "``" if start == 0 or text[start - 1] in _OPENERS else "''"
        else:
            tok = _CURLY_QUOTES.get(tok, tok)
        tokens.append(tok)
    return tokens


# --- SNLI ----------------------------------------------------------------------------------------------------------


def _snli_example(
    label: str, s1: list[str], s2: list[str], max_tokens: int, where: str
) -> tuple[list[str], list[str], int] | None:
    if label == "-":
        return None
    if label not in SNLI_LABELS:
        raise ValueError(f"{where}: unknown gold label {label!r} (expected one of {', '.join(SNLI_LABELS)} or '-')")
    if not s1 or not s2 or len(s1) > max_tokens or len(s2) > max_tokens:
        return None
    return s1, s2, SNLI_LABELS[label]


def read_snli_jsonl(path: str | Path, max_tokens: int = 100) -> list[tuple[list[str], list[str], int]]:
    """Read an official ``snli_1.0_*.jsonl`` file: ``[(premise tokens, hypothesis tokens, label)]``."""
    out = []
    for lineno, line in read_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
            label, s1, s2 = record["gold_label"], record["sentence1"], record["sentence2"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{where}: not an SNLI record with gold_label/sentence1/sentence2 ({err})") from None
        if label == "-":
            continue
        example = _snli_example(label, tokenize(s1), tokenize(s2), max_tokens, where)
        if example is not None:
            out.append(example)
    return out


def read_snli_tsv(
    path: str | Path, max_tokens: int = 100, tokenized: bool = True
) -> list[tuple[list[str], list[str], int]]:
    """Read ``gold_label<TAB>sentence1<TAB>sentence2`` lines (header optional): ``[(premise, hypothesis, label)]``.
    Sentences are split on spaces, or by :func:`tokenize` when ``tokenized`` is false."""
    out = []
    columns, width = (0, 1, 2), 3
    split = (lambda s: s.split()) if tokenized else tokenize
    for lineno, line in read_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        fields = line.split("\t")
        if lineno == 1 and fields[0] == "gold_label":
            try:
                columns = tuple(fields.index(name) for name in ("gold_label", "sentence1", "sentence2"))
            except ValueError:
                raise ValueError(f"{path}: the header lacks sentence1 or sentence2: {fields}") from None
            width = len(fields)
            continue
        where = f"{path}:{lineno}"
        if len(fields) != width:
            raise ValueError(f"{where}: expected {width} tab-separated fields, got {len(fields)}")
        label, s1, s2 = (fields[c] for c in columns)
        example = _snli_example(label, split(s1), split(s2), max_tokens, where)
        if example is not None:
            out.append(example)
    return out


def _snli_candidates(root: Path, split: str) -> list[tuple[Path, str]]:
    out = []
    for folder in (root, root / "snli_1.0"):
        out += [
            (folder / f"snli_1.0_{split}.jsonl", "jsonl"),
            (folder / f"snli_1.0_{split}.jsonl.gz", "jsonl"),
            (folder / f"{split}.tsv", "tsv"),
            (folder / f"{split}.tsv.gz", "tsv"),
        ]
    return out


def load_snli(root: str | Path, max_tokens: int = 100) -> dict[str, list[tuple[list[str], list[str], int]]]:
    """Read the SNLI splits found under ``root`` (docs/data.md#text: the file names searched) as train /
    valid / test; raise ``FileNotFoundError`` when none is found."""
    root = Path(root)
    out = {}
    for file_split, split in _SPLIT_NAMES.items():
        for path, kind in _snli_candidates(root, file_split):
            if path.is_file():
                reader = read_snli_jsonl if kind == "jsonl" else read_snli_tsv
                out[split] = reader(path, max_tokens=max_tokens)
                break
    if not out:
        names = ", ".join(str(p.relative_to(root)) for s in _SPLIT_NAMES for p, _ in _snli_candidates(root, s))
        raise FileNotFoundError(f"no SNLI split found in {root}; looked for: {names}")
    return out


# --- vocabulary ----------------------------------------------------------------------------------------------------


class Vocab:
    """Token ↔ id mapping with ``<pad>`` = 0 and ``<unk>`` = 1."""

    PAD = "<pad>"
    UNK = "<unk>"
    pad_index = 0
    unk_index = 1

    def __init__(self, itos: Sequence[str]) -> None:
        itos = list(itos)
        if itos[:2] != [self.PAD, self.UNK]:
            raise ValueError(f"a vocabulary must start with {self.PAD!r}, {self.UNK!r}; got {itos[:2]}")
        stoi = {tok: i for i, tok in enumerate(itos)}
        if len(stoi) != len(itos):
            dupes = sorted(tok for tok, n in Counter(itos).items() if n > 1)
            raise ValueError(f"duplicate tokens in the vocabulary: {dupes[:10]}")
        self.itos: list[str] = itos
        self.stoi: dict[str, int] = stoi

    @classmethod
    def build(cls, token_lists: Iterable[Iterable[str]], min_freq: int = 1) -> Vocab:
        """Specials, then tokens seen at least ``min_freq`` times, by count (descending) then alphabetically."""
        counts: Counter[str] = Counter()
        for tokens in token_lists:
            counts.update(tokens)
        for special in (cls.PAD, cls.UNK):
            counts.pop(special, None)
        kept = sorted((tok for tok, n in counts.items() if n >= min_freq), key=lambda tok: (-counts[tok], tok))
        return cls([cls.PAD, cls.UNK, *kept])

    def encode(self, tokens: Iterable[str]) -> list[int]:
        unk = self.unk_index
        return [self.stoi.get(tok, unk) for tok in tokens]

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens)"


# --- GloVe ---------------------------------------------------------------------------------------------------------


def _is_count_header(line: str) -> bool:
    fields = line.split(" ")
    return len(fields) == 2 and all(field.isdigit() for field in fields)


def read_glove(path: str | Path, vocab: Vocab, dim: int | None = None) -> tuple[torch.Tensor, int]:
    """Stream a GloVe text file and return the float32 ``[len(vocab), dim]`` matrix of the vocabulary's vectors (zeros
    where the file has none, and for the specials) and the number of vocabulary words found."""
    specials = {Vocab.PAD, Vocab.UNK}
    rows: dict[int, list[float]] = {}
    confirm = False  # whether the next line must confirm the dimension inferred from the first
    for lineno, line in read_lines(path):
        line = line.rstrip(" \r\n")
        if not line:
            continue
        spaces = line.count(" ")
        if dim is None:
            if lineno == 1 and _is_count_header(line):
                continue
            dim, confirm = spaces, True
            if dim < 1:
                raise ValueError(f"{path}:{lineno}: cannot infer the dimension from a line without a vector")
        elif confirm:
            if spaces != dim:
                raise ValueError(
                    f"{path}:{lineno}: {spaces} values where the first line has {dim}, so the dimension cannot be "
                    "inferred (is the first line damaged? pass dim to read this file anyway)"
                )
            confirm = False
        if spaces < dim:
            raise ValueError(f"{path}:{lineno}: expected a word and {dim} values, got {spaces + 1} fields")
        # fast path: most words contain no space, so the word ends at the first space
        word = line[: line.index(" ")] if spaces == dim else line.rsplit(" ", dim)[0]
        index = vocab.stoi.get(word)
        if index is None or index in rows or word in specials:
            continue
        try:
            vector = [float(v) for v in line.rsplit(" ", dim)[1:]]
        except ValueError as err:
            raise ValueError(f"{path}:{lineno}: bad vector for {word!r} ({err})") from None
        if not all(math.isfinite(v) for v in vector):
            raise ValueError(f"{path}:{lineno}: the vector of {word!r} holds nan or inf")
        rows[index] = vector
    if dim is None:
        raise ValueError(f"{path}: no vectors found (empty file) and no dim given")
    matrix = torch.zeros(len(vocab), dim, dtype=torch.float32)
    if rows:
        index = torch.tensor(list(rows), dtype=torch.long)
        matrix[index] = torch.tensor(list(rows.values()), dtype=torch.float32)
    return matrix, len(rows)


def _glove_cache_file(path: Path, vocab: Vocab, cache_dir: Path, dim: int | None) -> Path:
    stat = path.stat()
    key = json.dumps([str(path.resolve()), stat.st_size, stat.st_mtime_ns, dim, vocab.itos], ensure_ascii=False)
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:20]
    stem = path.name.split(".txt")[0][:60]
    return cache_dir / f"glove-{stem}-{digest}.pt"


def glove_cache(path: str | Path, vocab: Vocab, cache_dir: str | Path, dim: int | None = None) -> torch.Tensor:
    """:func:`read_glove` with a ``.pt`` cache keyed by the file (path, size, mtime), ``dim`` and the vocabulary."""
    path, cache_dir = Path(path), Path(cache_dir)
    cache_file = _glove_cache_file(path, vocab, cache_dir, dim)
    if cache_file.is_file():
        cached = torch.load(cache_file, map_location="cpu", weights_only=True)
        return cached["matrix"]
    matrix, found = read_glove(path, vocab, dim)
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=cache_file.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"matrix": matrix, "found": found, "source": str(path)}, f)
        os.replace(tmp, cache_file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return matrix


# --- tensors -------------------------------------------------------------------------------------------------------


def pad_batch(seqs: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into int64 ``[B, max_len]`` and return it with the int64 ``lengths`` ``[B]``."""
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    max_len = int(lengths.max()) if len(seqs) else 0
    ids = torch.full((len(seqs), max_len), pad, dtype=torch.long)
    for i, seq in enumerate(seqs):
        if seq:
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return ids, lengths


# --- datasets for train.py -----------------------------------------------------------------------------------------


def _resolve(path: str, data_dir: str | Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(data_dir) / p


def _vocab_and_vectors(
    train_tokens: list[list[str]], data_dir: str | Path, pretrained: str | None, cache_dir: str | Path
) -> tuple[Vocab, dict]:
    """The training vocabulary and, with ``pretrained``, its GloVe matrix (the ``extras`` of the splits)."""
    vocab = Vocab.build(train_tokens)
    extras: dict = {"vocab": vocab, "embeddings": None, "embedding_source": "random (trainable)"}
    if pretrained:
        path = _resolve(pretrained, data_dir)
        if not path.is_file():
            raise FileNotFoundError(f"embedding.pretrained={pretrained!r}: no file {path}")
        matrix = glove_cache(path, vocab, cache_dir)
        found = int((matrix.abs().sum(1) > 0).sum())
        extras.update(embeddings=matrix, embedding_source=f"{path.name} ({found} of {len(vocab) - 2} words)")
    return vocab, extras


def _ids(token_lists: list[list[str]], vocab: Vocab) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 ids right-padded to the longest sequence (the task trims each batch to its own longest) and lengths."""
    ids, lengths = pad_batch([vocab.encode(tokens) for tokens in token_lists])
    return ids.to(torch.int32), lengths


def _limit(examples: list, n: int | None) -> list:
    """``n`` examples drawn without replacement by a fixed seed, in file order (the files can be sorted by label)."""
    if n is None or n >= len(examples):
        return examples
    if n < 0:
        raise ValueError(f"a subset size must be non-negative, got {n}")
    return [examples[i] for i in sorted(random.Random(0).sample(range(len(examples)), n))]


def _limit_splits(raw: dict[str, list], subset: int | None, eval_subset: int | None) -> dict[str, list]:
    """``subset`` examples of train, ``eval_subset`` of valid and test (:func:`_limit`)."""
    return {split: _limit(data, subset if split == "train" else eval_subset) for split, data in raw.items()}


def _dims(extras: dict, num_classes: int) -> dict[str, int]:
    """The sizes a text task is built with: vocabulary, classes, pretrained vector size (0 without one)."""
    matrix = extras["embeddings"]
    return {"vocab_size": len(extras["vocab"]), "num_classes": num_classes,
            "embedding_dim": 0 if matrix is None else matrix.shape[1]}


def sst_dataset(
    data_dir: str,
    folder: str = "sst",
    binary: bool = True,
    check_sizes: bool = True,
    pretrained: str | None = None,
    lowercase: bool = False,
    cache_dir: str = ".cache/glove",
    subset: Annotated[int | None, NonNegative] = None,
    eval_subset: Annotated[int | None, NonNegative] = None,
) -> TensorSplits:
    """SST as :class:`~latentstruct.data.base.TensorSplits` for ``train.py``: each split ``{"x": int32 [N, n] word
    ids, "lengths": [N], "y": [N]}``; ``dims`` = ``vocab_size``, ``num_classes``, ``embedding_dim`` (0 without a
    pretrained file); ``extras`` = the :class:`Vocab` (built on the training sentences), the GloVe matrix or None, and
    a description of the embeddings. ``subset`` / ``eval_subset`` keep that many sentences of train / valid and test,
    drawn by a fixed seed (smoke runs); the official sizes are checked before (``check_sizes``, binary task).

    Args:
        data_dir: root of the real datasets.
        folder: the SST folder (train/dev/test.txt[.gz] PTB trees), relative to data_dir.
        binary: binary sentiment (neutral dropped) or 5 classes.
        check_sizes: refuse binary files whose sizes are not the official 6920 / 872 / 1821.
        pretrained: set through embedding.pretrained.
        lowercase: set through embedding.lowercase.
        cache_dir: set through embedding.cache_dir.
        subset: keep this many training examples, drawn by a fixed seed (smoke runs); null = all.
        eval_subset: keep this many valid / test examples, drawn likewise; null = all.
    """
    raw = load_sst(_resolve(folder, data_dir), binary=binary, check_sizes=check_sizes)
    raw = _limit_splits(raw, subset, eval_subset)
    if lowercase:
        raw = {split: [([t.lower() for t in toks], y) for toks, y in data] for split, data in raw.items()}
    vocab, extras = _vocab_and_vectors([toks for toks, _ in raw["train"]], data_dir, pretrained, cache_dir)
    splits = {}
    for split, data in raw.items():
        ids, lengths = _ids([toks for toks, _ in data], vocab)
        splits[split] = {"x": ids, "lengths": lengths, "y": torch.tensor([y for _, y in data], dtype=torch.long)}
    return TensorSplits(splits, dims=_dims(extras, 2 if binary else 5), extras=extras)


def snli_dataset(
    data_dir: str,
    folder: str = "snli",
    max_tokens: Annotated[int, AtLeast(1)] = 100,
    pretrained: str | None = None,
    lowercase: bool = False,
    cache_dir: str = ".cache/glove",
    subset: Annotated[int | None, NonNegative] = None,
    eval_subset: Annotated[int | None, NonNegative] = None,
) -> TensorSplits:
    """SNLI as :class:`~latentstruct.data.base.TensorSplits`: each split ``{"premise", "hypothesis": int32 ids,
    "premise_lengths", "hypothesis_lengths", "y"}``; ``dims`` and ``extras`` as for :func:`sst_dataset` (the vocabulary
    is built on both sentences of the training pairs). Refuses to run without the training split: the shared data
    folder holds dev and test only, and training on dev would not be the protocol.

    Args:
        data_dir: root of the real datasets.
        folder: the SNLI folder (snli_1.0_{train,dev,test}.jsonl or {train,dev,test}.tsv[.gz]), relative to data_dir.
        max_tokens: drop pairs with a longer sentence.
        pretrained: set through embedding.pretrained.
        lowercase: set through embedding.lowercase.
        cache_dir: set through embedding.cache_dir.
        subset: keep this many training examples, drawn by a fixed seed (smoke runs); null = all.
        eval_subset: keep this many valid / test examples, drawn likewise; null = all.
    """
    root = _resolve(folder, data_dir)
    raw = load_snli(root, max_tokens=max_tokens)
    missing = [split for split in ("train", "valid", "test") if split not in raw]
    if missing:
        raise FileNotFoundError(
            f"SNLI split(s) {', '.join(missing)} not found in {root} (found: {', '.join(raw) or 'none'}). The full "
            "SNLI 1.0 (snli_1.0_train.jsonl, 550k pairs) is needed to train; scripts/download_text_data.sh fetches it."
        )
    raw = _limit_splits(raw, subset, eval_subset)
    if lowercase:
        raw = {split: [([t.lower() for t in a], [t.lower() for t in b], y) for a, b, y in data]
               for split, data in raw.items()}
    vocab, extras = _vocab_and_vectors(
        [toks for a, b, _ in raw["train"] for toks in (a, b)], data_dir, pretrained, cache_dir
    )
    splits = {}
    for split, data in raw.items():
        premise, premise_lengths = _ids([a for a, _, _ in data], vocab)
        hypothesis, hypothesis_lengths = _ids([b for _, b, _ in data], vocab)
        splits[split] = {"premise": premise, "premise_lengths": premise_lengths, "hypothesis": hypothesis,
                         "hypothesis_lengths": hypothesis_lengths,
                         "y": torch.tensor([y for _, _, y in data], dtype=torch.long)}
    return TensorSplits(splits, dims=_dims(extras, len(SNLI_LABELS)), extras=extras)
