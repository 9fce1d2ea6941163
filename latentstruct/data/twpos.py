"""Twitter part-of-speech tagging (the ARK tweets, Gimpel et al. 2011; Owoputi et al. 2013, release v0.3; seed 004
Table 9): the reader and padded id tensors for :class:`latentstruct.tasks.energy_ner.SequenceLabelEnergy`.

* :func:`read_tagged` (``token<TAB>tag`` per line, a blank line between tweets), :func:`load_twpos`: train =
  ``oct27.train`` + ``oct27.dev`` (1,327 tweets), valid = ``oct27.test`` (500), test = ``daily547.conll`` (547)
  (:data:`TWPOS_SPLITS`, :data:`TWPOS_SIZES`); the 25 coarse tags :data:`TWPOS_TAGS`.
* :func:`twpos_dataset`: the tensors of :func:`latentstruct.data.conll.conll_dataset`, ``extras["metric"] =
  "token_acc"``.

The format and which papers the split follows (seed 004 names none): docs/data.md#twpos.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import torch

from latentstruct.data.base import TensorSplits
from latentstruct.data.conll import TAG_PAD, pad_ids, sample_subset, word_vectors
from latentstruct.data.files import first_file, read_lines
from latentstruct.data.text import Vocab
from latentstruct.ranges import NonNegative

__all__ = ["TWPOS_SIZES", "TWPOS_SPLITS", "TWPOS_TAGS", "load_twpos", "read_tagged", "twpos_dataset"]

#: the 25 tags of the ARK Twitter tagset (Owoputi et al. 2013, Appendix A)
TWPOS_TAGS: tuple[str, ...] = (
    "N", "O", "^", "S", "Z", "V", "A", "R", "!", "D", "P", "&", "T", "X", "Y",
    "#", "@", "~", "U", "E", "$", ",", "G", "L", "M",
)

#: split → the release's files it concatenates (each ``<name>`` or ``<name>.gz``)
TWPOS_SPLITS: dict[str, tuple[str, ...]] = {
    "train": ("oct27.train", "oct27.dev"),
    "valid": ("oct27.test",),
    "test": ("daily547.conll",),
}

#: tweets per split of the release (v0.3)
TWPOS_SIZES: dict[str, int] = {"train": 1327, "valid": 500, "test": 547}

_TAG_SET = frozenset(TWPOS_TAGS)

Tweet = tuple[list[str], list[str]]


def read_tagged(path: str | Path) -> list[Tweet]:
    """``(tokens, tags)`` per tweet of a ``token<TAB>tag`` file."""
    tweets: list[Tweet] = []
    tokens: list[str] = []
    tags: list[str] = []
    for lineno, line in read_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            if tokens:
                tweets.append((tokens, tags))
                tokens, tags = [], []
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0] or not fields[1]:
            raise ValueError(f"{path}:{lineno}: expected 'token<TAB>tag', got {line!r}")
        if fields[1] not in _TAG_SET:
            raise ValueError(f"{path}:{lineno}: tag {fields[1]!r} is not in the Twitter tagset {''.join(TWPOS_TAGS)}")
        tokens.append(fields[0])
        tags.append(fields[1])
    if tokens:
        tweets.append((tokens, tags))
    return tweets


def load_twpos(root: str | Path) -> dict[str, list[Tweet]]:
    """The three splits of :data:`TWPOS_SPLITS` read from ``root``."""
    root = Path(root)
    out = {}
    for split, names in TWPOS_SPLITS.items():
        out[split] = []
        for name in names:
            path = first_file([root / name, root / f"{name}.gz"])
            if path is None:
                raise FileNotFoundError(
                    f"missing {root / name}[.gz]; the Twitter POS folder must hold "
                    f"{', '.join(n for names in TWPOS_SPLITS.values() for n in names)} (token<TAB>tag, plain or .gz)"
                )
            out[split] += read_tagged(path)
    return out


def twpos_dataset(
    data_dir: str | Path,
    folder: str = "twpos",
    min_count: int = 1,
    lowercase: bool = False,
    check_sizes: bool = True,
    pretrained: str | None = None,
    cache_dir: str = ".cache/glove",
    subset: Annotated[int | None, NonNegative] = None,
    eval_subset: Annotated[int | None, NonNegative] = None,
) -> TensorSplits:
    """Twitter POS as :class:`~latentstruct.data.base.TensorSplits`: each split ``{"x": int64 [N, n] word ids (pad
    0), "lengths": int64 [N], "y": int64 [N, n] tag ids (pad -100)}``; ``dims`` = ``vocab_size``, ``num_tags`` (25),
    ``embedding_dim``; ``extras`` = ``vocab``, ``tag_names``, ``embeddings``, ``embedding_source``, ``metric``
    (``"token_acc"``). ``check_sizes`` refuses files whose tweet counts are not the release's
    (:data:`TWPOS_SIZES`); ``subset`` / ``eval_subset`` keep that many tweets of train / valid and test.

    Args:
        data_dir: root of the real datasets.
        folder: the Twitter POS folder (oct27.{train,dev,test}, daily547.conll; token<TAB>tag, plain or .gz),
            relative to data_dir unless absolute.
        min_count: words seen fewer times in train map to <unk>.
        check_sizes: refuse files whose tweet counts are not the v0.3 release's 1327 / 500 / 547.
        lowercase: set through embedding.lowercase.
        pretrained: set through embedding.pretrained.
        cache_dir: set through embedding.cache_dir.
        subset: keep this many training examples, drawn by a fixed seed (smoke runs); null = all.
        eval_subset: keep this many valid / test examples, drawn likewise; null = all.
    """
    root = Path(folder).expanduser()
    root = root if root.is_absolute() else Path(data_dir) / root
    raw = load_twpos(root)
    if check_sizes:
        sizes = {split: len(tweets) for split, tweets in raw.items()}
        if sizes != TWPOS_SIZES:
            raise ValueError(f"{root}: {sizes} tweets, expected the v0.3 release's {TWPOS_SIZES} "
                             "(dataset.check_sizes=false reads other files)")
    raw = {split: sample_subset(data, subset if split == "train" else eval_subset) for split, data in raw.items()}
    tag_index = {tag: i for i, tag in enumerate(TWPOS_TAGS)}

    def words(tokens: list[str]) -> list[str]:
        return [w.lower() for w in tokens] if lowercase else tokens

    vocab = Vocab.build((words(tokens) for tokens, _ in raw["train"]), min_freq=min_count)
    embeddings, source = word_vectors(pretrained, data_dir, vocab, cache_dir)
    splits = {}
    for split, tweets in raw.items():
        unknown = sorted({t for _, tags in tweets for t in tags} - set(tag_index))
        if unknown:
            raise ValueError(f"{split}: tags {unknown} are not in the Twitter tagset {''.join(TWPOS_TAGS)}")
        splits[split] = {
            "x": pad_ids([vocab.encode(words(tokens)) for tokens, _ in tweets], 0),
            "lengths": torch.tensor([len(tokens) for tokens, _ in tweets], dtype=torch.long),
            "y": pad_ids([[tag_index[t] for t in tags] for _, tags in tweets], TAG_PAD),
        }
    dims = {"vocab_size": len(vocab), "num_tags": len(TWPOS_TAGS),
            "embedding_dim": 0 if embeddings is None else embeddings.shape[1]}
    extras = {"vocab": vocab, "tag_names": list(TWPOS_TAGS), "embeddings": embeddings, "embedding_source": source,
              "metric": "token_acc"}
    return TensorSplits(splits, dims=dims, extras=extras)
