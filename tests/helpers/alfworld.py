"""The small generated ALFWorld task set the ALFWorld tests share (tests/envs/conftest.py builds it
once per session as the `cache_dir` fixture)."""

SIZES = {"train": 12, "valid_seen": 6, "valid_unseen": 6}
