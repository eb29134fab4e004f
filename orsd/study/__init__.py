"""`orsd-study`: a grid of orsd-train runs (arms × seeds) from one shared initial policy, with resume
and parallel jobs, compared with intervals over seeds (docs/study.md)."""
