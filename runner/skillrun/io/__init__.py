"""File and process plumbing every stage shares: atomic writes, regular-file reads, strict JSON,
secret redaction, terminal-safe text, and helper processes that die with their parent."""
