"""What every package shares and nothing of ours is imported by: the user-error type, safe
file I/O (atomic writes, UTF-8 line reading), the allocator setting (`memory`) and where and
in what precision torch computes (`runtime`)."""
