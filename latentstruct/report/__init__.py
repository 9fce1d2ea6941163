"""Run records -> the papers' tables, figures and reports (DESIGN.md §7): reads run records, never file names.

``tables`` (a table spec -> Markdown beside the paper's numbers), ``figures`` (the papers' figures), ``listops``
(ListOps analyses of the trained models), ``trees`` (the latent tree a trained SST / SNLI model gives a sentence),
``reproduce`` (a table spec's sweeps, then its tables, figures and extra steps: ``make table T=<paper>/<table>``),
``status`` (a table's status against the paper's protocol: the line that opens it and the JSON beside it),
and ``report`` (results/README.md from those JSON files: ``make report``).
"""
