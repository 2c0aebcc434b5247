"""The estimators: PyTorch (``torch/``), Keras 3 (``keras/``) and closed forms from bare numbers (``napkin``)."""
