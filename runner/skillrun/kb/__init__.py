"""The knowledge base: skill cards, fact cards, schemas, the index and its lint."""
