"""sqs-bench: reproduces the SQS paper's tables beside baselines re-run on the same models and data.

Benchmarks are data: TOML recipes (``recipes/``) → result JSON (``runner``) → markdown tables and PNG plots
(``report``). ``python -m sqs_bench --help`` for the command line. Importing this package imports nothing
heavy; the submodules hold the pieces (``data``, ``models``, ``train``, ``baselines``, ``dgms``,
``compression``, ``stats``, ``sqs_method``, ``config``, ``runner``, ``report``).
"""

__version__ = "0.1.0"
