"""The evidence store: validation artifacts written and read back, their index (current / superseded /
stale), the verdict rule, timing samples, kernel source identity, tuning records and card claims."""
