"""The pieces of a local run (`perfdiag run`): launching the ranks, watching them through the
spool, and showing the verdict. `perfdiag.local.runner` puts them together."""
