"""The citation rule reward: each rule on hand-made citations, the batched form against the one-citation form, and
the agreement statistics."""

from __future__ import annotations

import random

import pytest
import torch

from latentstruct.data.citation_rules import (
    CUE_INDEX,
    FIELDS,
    RULES,
    agreement,
    citation_reward,
    reward,
    rule_scores,
    score,
    token_cues,
    value,
)

CITATION = ["A.", "Smith", "and", "B.", "Jones.", '"Learning', 'rules."', "In", "Proc.", "ICML,", "pp.", "1-10,",
            "May", "1999."]
GOLD = ["author"] * 5 + ["title"] * 2 + ["booktitle"] * 3 + ["pages"] * 2 + ["date"] * 2


def test_the_cues_of_a_citation():
    cues = token_cues(CITATION)
    on = {c: [t for t in range(len(CITATION)) if cues[t, i]] for c, i in CUE_INDEX.items()}
    assert on["year"] == [13] and on["month"] == [12] and on["pp"] == [10] and on["page_range"] == [11]
    assert on["in"] == [7] and on["quoted"] == [5, 6] and on["initial"] == [0, 3] and on["first"] == [0]
    assert on["venue_word"] == [8] and on["journal_word"] == [] and on["editor_word"] == []
    assert token_cues(["(1987)", "1987a.", "19870", "2-3", "(eds.)", "W.-P.", "Technical", "Report"])[
        :, [CUE_INDEX[c] for c in ("year", "page_range", "editor_word", "initial", "tech_word")]].tolist() == [
        [1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0],
        [0, 0, 0, 0, 1], [0, 0, 0, 0, 1]]


def test_the_gold_tagging_satisfies_every_rule():
    s = score(CITATION, GOLD)
    assert s == {"year_date": 1, "pp_pages": 1, "in_booktitle": 1, "quoted_title": 2, "initials_author": 2,
                 "contiguous": 0, "order": 0, "month_date": 1, "range_pages": 1, "first_author": 1, "editor_word": 0,
                 "tech_word": 0, "institution_word": 0, "publisher_word": 0, "venue_word": 1, "journal_word": 0,
                 "volume_word": 0}
    assert citation_reward(CITATION, GOLD) == sum(s.values()) == 11


@pytest.mark.parametrize("change,rule,expected", [
    ({13: "note"}, "year_date", -1),  # the year not a date
    ({11: "volume"}, "pp_pages", -1),  # pp. followed by a non-page
    ({7: "title"}, "in_booktitle", -1),  # In outside the booktitle
    ({8: "journal"}, "in_booktitle", -1),  # In and the next token in different fields
    ({6: "author"}, "quoted_title", 0),  # one quoted token right, one wrong
    ({3: "title"}, "initials_author", 0),
    ({4: "title", 5: "author"}, "contiguous", -2),  # author and title each in two segments
    ({10: "author", 11: "author"}, "order", -1),  # booktitle -> author goes back
    ({12: "pages"}, "month_date", -1),
    ({0: "title"}, "first_author", -1),
])
def test_each_rule_penalises_its_pattern(change, rule, expected):
    tags = [change.get(t, tag) for t, tag in enumerate(GOLD)]
    assert score(CITATION, tags)[rule] == expected
    assert citation_reward(CITATION, tags) < citation_reward(CITATION, GOLD)


def test_contiguity_counts_every_extra_segment_and_the_date_is_free_in_the_order():
    tokens = ["x"] * 6
    assert score(tokens, ["author", "title", "author", "title", "author", "date"])["contiguous"] == -3
    assert score(tokens, ["date", "author", "title", "date", "journal", "journal"])["order"] == 0
    assert score(tokens, ["journal", "title", "author", "title", "date", "journal"])["order"] == -2


def test_the_batched_rules_equal_the_one_citation_form_and_ignore_padding():
    rng = random.Random(0)
    citations = [CITATION, CITATION[:6], ["In", "pp.", "1999", "May"]]
    n = max(map(len, citations))
    cues = torch.zeros(len(citations), n, len(CUE_INDEX))
    mask = torch.zeros(len(citations), n)
    for b, c in enumerate(citations):
        cues[b, :len(c)] = token_cues(c)
        mask[b, :len(c)] = 1
    tags = torch.tensor([[[rng.randrange(len(FIELDS)) for _ in range(n)] for _ in citations] for _ in range(4)])
    batched = rule_scores(cues, tags, mask)  # [K, B, R]
    assert batched.shape == (4, 3, len(RULES))
    for k in range(4):
        for b, c in enumerate(citations):
            one = score(c, [FIELDS[t] for t in tags[k, b, :len(c)].tolist()])
            assert batched[k, b].tolist() == list(one.values())
    other = tags.clone()
    other[..., 6:] = 0  # padding of the short citations changes nothing
    assert torch.equal(reward(cues, other, mask)[:, 1:], reward(cues, tags, mask)[:, 1:])
    v = value(cues, tags, mask)
    assert ((0 <= v) & (v <= 1)).all()


def test_agreement_on_hand_made_citations():
    stats = agreement([(CITATION, GOLD)] * 3, corruptions=5)
    assert stats["citations"] == 3 and stats["rules"]["year_date"] == {"source": "issue", "fired": 3, "right": 3,
                                                                       "citations": 0, "violated": 0}
    assert stats["rules"]["contiguous"]["citations"] == 3 and stats["rules"]["contiguous"]["violated"] == 0
    assert stats["gold_tied"] == 1.0 and 0 < stats["spearman"] <= 1
