"""What every package shares and nothing of ours is imported by: the user-error type and
safe file I/O (atomic writes, UTF-8 line reading)."""
