"""What the suites, tools and investigations share: the zoo, the Keras cases, ground truth, isolated workers, baselines.

Nothing here runs a benchmark or writes a result; see ``benchmarks/README.md``.
"""
