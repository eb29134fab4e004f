"""What a run leaves behind and how it is read: the run directory (run_dir.py), TensorBoard/W&B
scalars (logger.py), reading the records (records.py), curves.png (curves.py), the HTML report
(html.py), `orsd-report` (cli.py). Works from plain records, never the config classes."""
