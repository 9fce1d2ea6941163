"""The rule reward of citation field extraction (seed 004 Table 4, the indirect supervision of Rooshenas et al.
2019): domain-knowledge rules that score a tagging of a citation without its gold fields, noisily.

The reward is a sum of rule scores, R(w, y) = Σ_r score_r(w, y), each weight 1: a cue rule scores +1 per token
showing its cue (a year, ``pp.``, a quoted span, ...) tagged with the field the cue points to and −1 per such token
tagged otherwise; a structure rule scores −1 per violation (a field in two segments, the author → title → venue order
broken). Rewards are computed on discrete taggings only, never differentiated.

* :func:`token_cues`: the cues of one citation, ``[n, P]`` float 0/1 over :data:`CUES`, from its words alone.
* :data:`RULES`; :func:`rule_scores` ``[*, R]``, :func:`reward` ``[*]``, for ``cues`` ``[*, n, P]``, ``tags``
  ``[*, n]`` (field ids, anything at padding) and ``mask`` ``[*, n]``, broadcast against each other (e.g. ``[B, n, P]``
  cues with ``[K, B, n]`` sampled tags); :func:`score`, :func:`citation_reward`: one citation given as strings.
* :func:`agreement`: how noisy the reward is against the gold taggings, per rule and over corrupted taggings
  (``python -m latentstruct.data.citation_rules``, written to ``results/energy/citation_rules.md`` by ``make
  table-energy-citation``).

The cues, the rule table (which rules come from issue #23 and which are ours) and the known noise:
docs/data.md#citation_rules.
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["CUES", "CUE_INDEX", "CUE_RULES", "FIELDS", "RULES", "Rule", "agreement", "agreement_markdown",
           "citation_reward", "reward", "rule_scores", "score", "token_cues", "value"]

#: the fields, tag id = index (the same tuple as latentstruct.data.cora.CORA_FIELDS, which imports this module)
FIELDS: tuple[str, ...] = ("author", "title", "journal", "booktitle", "date", "pages", "volume", "publisher",
                           "location", "institution", "editor", "tech", "note")
_F = {f: i for i, f in enumerate(FIELDS)}

_MONTHS = {"jan", "january", "feb", "february", "mar", "march", "apr", "april", "may", "jun", "june", "jul", "july",
           "aug", "august", "sep", "sept", "september", "oct", "october", "nov", "november", "dec", "december"}
_KEYWORDS = {
    "editor_word": {"eds", "ed", "editor", "editors"},
    "tech_word": {"technical", "report", "tr", "tech"},
    "institution_word": {"university", "univ", "dept", "department", "institute", "laboratory", "lab"},
    "publisher_word": {"press", "publishers", "publisher", "publishing", "verlag", "springer-verlag", "wiley",
                       "addison-wesley", "kluwer", "elsevier"},
    "venue_word": {"proceedings", "proc", "conference", "conf", "workshop", "symposium"},
    "journal_word": {"journal", "transactions", "trans"},
    "volume_word": {"vol", "volume", "no"},
}
#: the token cues, in the order of the last dimension of :func:`token_cues`
CUES: tuple[str, ...] = ("year", "month", "pp", "page_range", "in", "quoted", "initial", "first", *_KEYWORDS)
#: cue name → its index in the last dimension of :func:`token_cues`
CUE_INDEX: dict[str, int] = {c: i for i, c in enumerate(CUES)}
_C = CUE_INDEX

_YEAR = re.compile(r"^[(\[]?(19|20)\d\d[a-z]?[)\]]?[.,;:]*$")
_RANGE = re.compile(r"^\(?\d+\s*-{1,2}\s*\d+\)?[.,;:]*$")
_INITIAL = re.compile(r"^([A-Z]\.-?)+,?$")


def _bare(word: str) -> str:
    """Lower case without surrounding punctuation (``(eds.)`` → ``eds``)."""
    return word.lower().strip(".,;:()[]{}\"'`")


def token_cues(tokens: Sequence[str]) -> torch.Tensor:
    """``[n, P]`` float 0/1: which of :data:`CUES` each token shows (docs/data.md#citation_rules)."""
    out = torch.zeros(len(tokens), len(CUES))
    quoted = False
    for t, word in enumerate(tokens):
        bare = _bare(word)
        opens = word.startswith(('"', "``")) and not quoted
        if opens:
            quoted = True
        out[t, _C["quoted"]] = float(quoted)
        if quoted and (word.rstrip(".,;:").endswith(('"', "''")) and (not opens or len(word.strip('"`\'.,;:')) > 0)):
            quoted = False
        out[t, _C["year"]] = float(bool(_YEAR.match(word)))
        out[t, _C["month"]] = float(bare in _MONTHS)
        out[t, _C["pp"]] = float(word in ("pp.", "pp", "pp.,", "Pp.", "p.", "pages", "Pages"))  # "P." is an initial
        out[t, _C["page_range"]] = float(bool(_RANGE.match(word)))
        out[t, _C["in"]] = float(word == "In" and t > 0)
        out[t, _C["initial"]] = float(bool(_INITIAL.match(word)))
        out[t, _C["first"]] = float(t == 0)
        for cue, words in _KEYWORDS.items():
            out[t, _C[cue]] = float(bare in words)
    return out


# --- rules over tensors --------------------------------------------------------------------------------------------


def _is(tags: torch.Tensor, fields: Sequence[str]) -> torch.Tensor:
    ids = torch.tensor([_F[f] for f in fields], device=tags.device)
    return (tags.unsqueeze(-1) == ids).any(-1).float()


def _next(x: torch.Tensor, fill: float) -> torch.Tensor:
    """x shifted one token left along the last dimension (``fill`` at the end)."""
    return torch.cat([x[..., 1:], torch.full_like(x[..., :1], fill)], -1)


def _cue_rule(cue: str, fields: Sequence[str]) -> Callable[..., torch.Tensor]:
    def rule(cues: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        fired = cues[..., _C[cue]] * mask
        return (fired * (2 * _is(tags, fields) - 1)).sum(-1)

    rule.__doc__ = f"+1 per {cue} token tagged {' or '.join(fields)}, −1 per {cue} token tagged otherwise."
    return rule


def _pp_pages(cues, tags, mask):
    """+1 per ``pp.`` token that is tagged pages with the next token, −1 per other ``pp.`` followed by a token."""
    fired = cues[..., _C["pp"]] * mask * _next(mask, 0.0)
    pages = _is(tags, ["pages"])
    return (fired * (2 * pages * _next(pages, 0.0) - 1)).sum(-1)


def _in_booktitle(cues, tags, mask):
    """+1 per ``In`` (not first, followed by a token) tagged booktitle or editor with the next token in the same
    field, −1 per other such ``In``."""
    fired = cues[..., _C["in"]] * mask * _next(mask, 0.0)
    same = (tags == _next(tags, -1)).float()
    return (fired * (2 * _is(tags, ["booktitle", "editor"]) * same - 1)).sum(-1)


def _contiguous(cues, tags, mask):
    """−1 per segment of a field beyond its first."""
    prev = torch.cat([torch.full_like(tags[..., :1], -1), tags[..., :-1]], -1)
    starts = (tags != prev).float() * mask  # a segment starts where the field changes
    onehot = torch.nn.functional.one_hot(tags.clamp(0, len(FIELDS) - 1), len(FIELDS)).float()
    per_field = (onehot * starts.unsqueeze(-1)).sum(-2)
    return -(per_field - 1).clamp_min(0).sum(-1)


_RANK = torch.tensor([0.0, 1.0, *([2.0] * (len(FIELDS) - 2))])
_RANK[_F["date"]] = float("nan")  # the date may stand anywhere


def _order(cues, tags, mask):
    """−1 per boundary between consecutive tokens where the field's rank author 0 < title 1 < venue 2 decreases
    (the date has no rank)."""
    rank = _RANK.to(tags.device)[tags.clamp(0, len(FIELDS) - 1)]
    back = (_next(rank, float("nan")) < rank).float()  # NaN compares False: date or the end
    return -(back * mask * _next(mask, 0.0)).sum(-1)


@dataclass(frozen=True)
class Rule:
    """One rule: its name, where it comes from (``issue`` or ``ours``, docs/data.md#citation_rules), and its
    function."""

    name: str
    source: str
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


#: the cue rules: name → (source, cue, the fields the cue points to)
CUE_RULES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "year_date": ("issue", "year", ("date",)),
    "quoted_title": ("issue", "quoted", ("title",)),
    "initials_author": ("issue", "initial", ("author", "editor")),
    "month_date": ("ours", "month", ("date",)),
    "range_pages": ("ours", "page_range", ("pages",)),
    "first_author": ("ours", "first", ("author",)),
    "editor_word": ("ours", "editor_word", ("editor",)),
    "tech_word": ("ours", "tech_word", ("tech",)),
    "institution_word": ("ours", "institution_word", ("institution",)),
    "publisher_word": ("ours", "publisher_word", ("publisher",)),
    "venue_word": ("ours", "venue_word", ("booktitle",)),
    "journal_word": ("ours", "journal_word", ("journal",)),
    "volume_word": ("ours", "volume_word", ("volume",)),
}
_CUE = {name: Rule(name, source, _cue_rule(cue, fields)) for name, (source, cue, fields) in CUE_RULES.items()}

#: the rules of docs/data.md#citation_rules, in its order
RULES: tuple[Rule, ...] = (
    _CUE["year_date"],
    Rule("pp_pages", "issue", _pp_pages),
    Rule("in_booktitle", "issue", _in_booktitle),
    _CUE["quoted_title"],
    _CUE["initials_author"],
    Rule("contiguous", "issue", _contiguous),
    Rule("order", "issue", _order),
    *(_CUE[name] for name, (source, _, _) in CUE_RULES.items() if source == "ours"),
)


def rule_scores(cues: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[*, R]``: every rule's score (shapes in docs/data.md#citation_rules)."""
    tags = torch.where(mask > 0, tags, torch.zeros_like(tags))
    return torch.stack([rule.fn(cues, tags, mask.to(cues.dtype)) for rule in RULES], -1)


def reward(cues: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[*]``: R(w, y), the sum of the rule scores."""
    return rule_scores(cues, tags, mask).sum(-1)


def value(cues: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[*]`` in [0, 1]: the reward as a score per token, clamp(1/2 + R / (2N), 0, 1) (DVN's regression target on
    unlabelled citations; our choice of normalisation)."""
    n = mask.to(cues.dtype).sum(-1).clamp_min(1)
    return (0.5 + reward(cues, tags, mask) / (2 * n)).clamp(0, 1)


def score(tokens: Sequence[str], tags: Sequence[str]) -> dict[str, float]:
    """Every rule's score of one citation given as strings (tokens and their field names)."""
    if len(tokens) != len(tags):
        raise ValueError(f"{len(tokens)} tokens but {len(tags)} tags")
    ids = torch.tensor([_F[t] for t in tags])
    values = rule_scores(token_cues(tokens), ids, torch.ones(len(tokens)))
    return {rule.name: float(v) for rule, v in zip(RULES, values, strict=True)}


def citation_reward(tokens: Sequence[str], tags: Sequence[str]) -> float:
    """R(w, y) of one citation given as strings."""
    return sum(score(tokens, tags).values())


# --- agreement with the gold fields ---------------------------------------------------------------------------------


def _corrupt(tags: list[int], rng: random.Random) -> list[int]:
    """A plausible wrong tagging: a segment boundary moved by 1-3 tokens, or a fraction (10-50%) of the tokens
    given random fields."""
    out = list(tags)
    bounds = [t for t in range(1, len(out)) if out[t] != out[t - 1]]
    if bounds and rng.random() < 0.5:
        t, shift = rng.choice(bounds), rng.choice([-3, -2, -1, 1, 2, 3])
        lo, hi = sorted((t, min(max(t + shift, 0), len(out))))
        out[lo:hi] = [out[t - 1] if shift > 0 else out[t]] * (hi - lo)
    else:
        p = rng.uniform(0.1, 0.5)
        out = [rng.randrange(len(FIELDS)) if rng.random() < p else f for f in out]
    return out


def _spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = torch.tensor(ranks(a)), torch.tensor(ranks(b))
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def agreement(citations: Sequence[tuple[Sequence[str], Sequence[str]]], corruptions: int = 20,
              seed: int = 0) -> dict:
    """How noisy the reward is against gold taggings: per rule, its firings on the gold citations and the share it
    scores right (cue rules: firing tokens whose gold field is the cue's; structure rules: citations the gold
    violates); and over ``corruptions`` wrong taggings per citation (:func:`_corrupt`), the Spearman correlation of
    R with token accuracy within a citation (mean over citations), and how often the gold tagging has the highest
    reward (ties count as not)."""
    rng = random.Random(seed)
    per_rule = {r.name: {"source": r.source, "fired": 0, "right": 0, "citations": 0, "violated": 0} for r in RULES}
    cue_of = {"pp_pages": "pp", "in_booktitle": "in", **{name: cue for name, (_, cue, _) in CUE_RULES.items()}}
    correlations, gold_best, gold_tied, gold_rewards, covered, tokens_all = [], 0, 0, [], 0, 0
    for tokens, tags in citations:
        cues = token_cues(tokens)
        gold = [_F[t] for t in tags]
        scores = score(tokens, tags)
        for r in RULES:
            stats = per_rule[r.name]
            s = scores[r.name]
            if r.name in ("contiguous", "order"):
                stats["citations"] += 1
                stats["violated"] += int(s < 0)
            else:
                cue = cue_of[r.name]
                fired = int(cues[:, _C[cue]].sum()) if r.name not in ("pp_pages", "in_booktitle") else None
                if fired is None:  # these two fire only where a next token exists
                    fired = int((cues[:-1, _C[cue]]).sum())
                stats["fired"] += fired
                stats["right"] += int(round((s + fired) / 2))
        n = len(tokens)
        wrong = [_corrupt(gold, rng) for _ in range(corruptions)]
        all_tags = torch.tensor([gold, *wrong])
        rewards = reward(cues, all_tags, torch.ones(n)).tolist()
        accuracy = [sum(a == b for a, b in zip(w, gold, strict=True)) / n for w in all_tags.tolist()]
        gold_rewards.append(rewards[0])
        gold_best += int(rewards[0] > max(rewards[1:]))
        gold_tied += int(rewards[0] >= max(rewards[1:]))
        covered += int((cues[:, [_C[c] for c in CUES if c not in ("first", "in")]].sum(-1) > 0).sum())
        tokens_all += n
        rho = _spearman(rewards, accuracy)
        if rho is not None:
            correlations.append(rho)
    return {"citations": len(citations), "rules": per_rule, "corruptions": corruptions,
            "spearman": sum(correlations) / max(len(correlations), 1), "gold_best": gold_best / len(citations),
            "gold_tied": gold_tied / len(citations), "coverage": covered / max(tokens_all, 1),
            "gold_reward_mean": sum(gold_rewards) / len(gold_rewards)}


def agreement_markdown(stats: dict, what: str) -> str:
    """The agreement statistics as a Markdown page."""
    lines = [
        "# The citation rule reward against the gold fields",
        "",
        f"Generated by `python -m latentstruct.data.citation_rules` (`make table-energy-citation`) on {what}: "
        f"{stats['citations']} citations. The rules: `latentstruct/data/citation_rules.py` (source `issue`: listed "
        "in issue #23 from Rooshenas et al.'s description, patterns and weights ours; `ours`: added here).",
        "",
        "| rule | source | fires (tokens) | right on gold | share right |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, s in stats["rules"].items():
        if "citations" in s and s["citations"] and name in ("contiguous", "order"):
            ok = s["citations"] - s["violated"]
            lines.append(f"| {name} | {s['source']} | {s['citations']} citations | {ok} not violated | "
                         f"{100 * ok / s['citations']:.1f}% |")
        else:
            share = f"{100 * s['right'] / s['fired']:.1f}%" if s["fired"] else "-"
            lines.append(f"| {name} | {s['source']} | {s['fired']} | {s['right']} | {share} |")
    lines += [
        "",
        f"Ranking: for each citation, {stats['corruptions']} wrong taggings (a segment boundary moved by 1-3 tokens, "
        "or 10-50% of the tokens given random fields; seed 0) beside the gold one.",
        "",
        f"- Spearman correlation of the reward with token accuracy within a citation (mean): "
        f"**{stats['spearman']:.3f}**",
        f"- the gold tagging has the strictly highest reward: **{100 * stats['gold_best']:.1f}%** of the citations",
        f"- the gold tagging's reward is at least every wrong tagging's: {100 * stats['gold_tied']:.1f}%",
        f"- mean reward of the gold tagging: {stats['gold_reward_mean']:.2f}",
        f"- tokens that show a cue (besides `first` and `In`): {100 * stats['coverage']:.1f}%; the fields of the "
        "others are constrained only by the structure rules (contiguity, order), so many wrong taggings tie",
        "",
        "A reward that agreed with the gold fields would be right on 100% of its firings, rank every gold tagging "
        "first and correlate 1 with accuracy; the gaps are the reward's noise.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    from latentstruct.data.cora import load_cora  # cora imports this module

    parser = argparse.ArgumentParser(description="The rule reward's agreement with the gold Cora fields")
    parser.add_argument("--data-dir", default=None, help="root of the real datasets (default $LATENTSTRUCT_DATA)")
    parser.add_argument("--out", default=None, help="write the Markdown page here (default: print it)")
    parser.add_argument("--corruptions", type=int, default=20)
    args = parser.parse_args(argv)
    import os

    root = Path(args.data_dir or os.environ.get("LATENTSTRUCT_DATA", "data")) / "cora"
    citations = load_cora(root)
    text = agreement_markdown(agreement(citations, args.corruptions), "all 500 Cora citations (every one has gold "
                              "fields; the labelled pools are 5-50 of them)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        print(text)


if __name__ == "__main__":
    main()
