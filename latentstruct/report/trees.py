"""Print and draw the latent MAP tree a trained SST / SNLI model gives a sentence (seed 001, Figures 4-6).

    python -m latentstruct.show_trees RUN_DIR "A sentence to parse ." [--out tree.png] [--data-dir DIR]

``RUN_DIR`` is a run directory of ``python -m latentstruct.train`` with a latent-tree task (``task=sst`` or
``task=nli``; not the baseline). The model is rebuilt from the configuration and the weights in its ``checkpoint.pt``
(the state at the run's **last** evaluation, not necessarily the selected best one); the vocabulary
is rebuilt from the run's dataset (same files, same config → the same ids). The sentence is split by
:func:`latentstruct.data.text.tokenize` (PTB-style; lower-cased when the run used ``embedding.lowercase``); words
outside the training vocabulary are ``<unk>`` and listed. Prints the tree (indented) and its depth, and draws it as
arcs above the sentence into ``--out`` (default ``RUN_DIR/trees/<first words>.png``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

import latentstruct.config  # noqa: F401  (registers the resolvers the run configs use)
from latentstruct.data.text import tokenize
from latentstruct.records import load_checkpoint
from latentstruct.tasks.text import _TreeTask
from latentstruct.train import build_model
from latentstruct.trees import depth, draw_tree, format_tree, heads_from_arcs

__all__ = ["load_tree_model", "parse_sentence", "main"]


def load_tree_model(run_dir: str | Path, data_dir: str | None = None):
    """The trained latent-tree task of ``run_dir`` (on the CPU, in eval mode) and its vocabulary."""
    run_dir = Path(run_dir)
    ckpt_path = run_dir / "checkpoint.pt"
    if not ckpt_path.is_file():
        raise FileNotFoundError(f"{ckpt_path} not found: RUN_DIR must be a run directory of latentstruct.train")
    ckpt = load_checkpoint(ckpt_path, torch.device("cpu"))
    cfg = OmegaConf.create(ckpt["config"])  # the run's configuration, as checkpointed
    cfg.paths.output_dir = str(run_dir)  # the saved value is a ${hydra:...} interpolation
    if data_dir is not None:
        cfg.paths.data_dir = data_dir
    data = instantiate(cfg.dataset)
    if "vocab" not in data.extras:
        raise ValueError(f"{run_dir} is not a text run (dataset {cfg.dataset._target_} has no vocabulary)")
    model = build_model(cfg, data.dims, data.extras)
    if not isinstance(model, _TreeTask) or model.scorer is None:
        raise ValueError(f"{run_dir}: the model has no latent tree (task {cfg.task._target_}, latent={cfg.latent})")
    model.load_state_dict(ckpt["model"])
    return model.eval(), data.extras["vocab"], bool(cfg.embedding.lowercase)


def parse_sentence(model, vocab, sentence: str, lowercase: bool = False) -> tuple[list[str], list[int], list[str]]:
    """(tokens, heads, unknown tokens) of the model's MAP tree for ``sentence``."""
    tokens = tokenize(sentence)
    if not tokens:
        raise ValueError("the sentence has no tokens")
    words = [t.lower() for t in tokens] if lowercase else tokens
    ids = torch.tensor([vocab.encode(words)])
    z = model.parse(ids, torch.tensor([len(tokens)]))[0]
    unknown = [t for t, w in zip(tokens, words, strict=True) if w not in vocab]
    return tokens, heads_from_arcs(z), unknown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latentstruct.show_trees", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a run directory of latentstruct.train (task sst or nli, latent model)")
    parser.add_argument("sentence", help="the sentence, raw text (tokenized PTB-style)")
    parser.add_argument("--out", help="PNG to write (default: RUN_DIR/trees/<first words>.png)")
    parser.add_argument("--data-dir", help="root of the datasets, if not the run's paths.data_dir")
    args = parser.parse_args(argv)
    model, vocab, lowercase = load_tree_model(args.run_dir, args.data_dir)
    tokens, heads, unknown = parse_sentence(model, vocab, args.sentence, lowercase)
    print(format_tree(tokens, heads))
    print(f"depth {depth(heads)}; heads {heads}")
    if unknown:
        print(f"not in the training vocabulary (<unk>): {' '.join(unknown)}")
    slug = re.sub(r"[^A-Za-z0-9]+", "_", " ".join(tokens[:6])).strip("_") or "tree"
    out = Path(args.out) if args.out else Path(args.run_dir) / "trees" / f"{slug}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"wrote {draw_tree(tokens, heads, out, title=f'{Path(args.run_dir).name}: depth {depth(heads)}')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
