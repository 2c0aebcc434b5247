"""The benchmarks the README quotes: each a module with ``main()``, run as ``python -m benchmarks.suites.<name>``.

Each writes its result under ``benchmarks/results/<suite>/``; ``benchmarks/README.md`` lists the current one per host.
"""
