"""Runnable examples, one per front door; installed with the package as ``nnmem_callbacks.examples``.

``nnmem demo`` runs :mod:`nnmem_callbacks.examples.lightning_quickstart`, and the CLI's factory specs work from any
folder: ``nnmem estimate nnmem_callbacks.examples.models:resnet50 -i 3,224,224``.
"""
