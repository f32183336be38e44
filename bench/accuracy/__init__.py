"""Rule accuracy benchmark: labelled faulty CPU training runs, clean twins, per-rule metrics.

``python -m bench.accuracy`` (about 10 minutes on 2 cores) regenerates docs/accuracy.md;
``--quick`` is a smoke run. See docs/accuracy.md for the method and the findings.
"""
