"""The fault-injection suite of ``make reliability`` (issue #20): kills and resumes, kills during a checkpoint write,
concurrent launchers on one sweep, damaged input files (:mod:`.readers`) and out-of-range settings (:mod:`.values`).
``python -m reliability`` (from the repository root; like ``bench/``, not part of the installed package) runs it and
writes ``results/reliability.md``; ``make test`` runs a small version of each check."""
