"""Tools over committed results: provenance, merging runs, re-predicting without measuring, rendering tables."""
