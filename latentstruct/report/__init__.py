"""Run records -> the papers' tables, figures and reports (DESIGN.md §7): reads run records, never file names.

``tables`` (a table spec -> Markdown beside the paper's numbers), ``figures`` (the papers' figures), ``listops``
(ListOps analyses of the trained models), ``trees`` (the latent tree a trained SST / SNLI model gives a sentence) and
``reproduce`` (a table spec's sweeps, then its tables, figures and extra steps: ``make table T=<paper>/<table>``).
"""
