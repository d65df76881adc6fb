"""What reviewers read: the evidence report (terminal and HTML) and flat rows for --format csv|tsv."""
