"""What a run leaves behind and how it is read: the run directory (run_dir.py), TensorBoard and
curves (reporter.py), the HTML report (html.py). Works from plain records, never the config classes."""
