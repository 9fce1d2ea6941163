"""bench/compose.py: one composition timed both ways, on two configurations."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import compose  # noqa: E402
from latentstruct import compose_cache  # noqa: E402


def test_both_ways_are_timed_and_the_cache_is_on_again_after(tmp_path, monkeypatch):
    seen = []
    per_compose = compose.per_compose

    def spy(overrides):  # which way each timing composed
        seen.append(compose_cache.ConfigRepository.load_config is compose_cache._load_config)
        return per_compose(overrides)

    monkeypatch.setattr(compose, "per_compose", spy)
    assert compose.main(["--out", str(tmp_path / "compose.md"), "--rounds", "1", "--cases", "2"]) == 0
    row = json.loads((tmp_path / "compose.json").read_text())["row"]
    assert row["cases"] == 2 and len(row["runs"]["hydra"]) == len(row["runs"]["cached"]) == 1
    assert row["hydra"] > 0 and row["cached"] > 0
    assert seen == [False, True, False, True]  # untimed each, then the round: Hydra first
    assert compose_cache.ConfigRepository.load_config is compose_cache._load_config
    assert "| Hydra 1.3 as it comes" in (tmp_path / "compose.md").read_text()
