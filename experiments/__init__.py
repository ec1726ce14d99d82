"""Entry points: ``python -m experiments.<name>`` (cleanup, bench, …)."""
