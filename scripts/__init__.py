"""Data download, device and cluster helpers, run as scripts (``python scripts/bundle.py ...``) or as modules
(``python -m scripts.carry ...``); a package so that the tests import them."""
