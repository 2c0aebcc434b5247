"""One-off questions: each module's docstring opens with its question and its date; results in results/investigations/."""
