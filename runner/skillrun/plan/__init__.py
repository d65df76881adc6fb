"""Planning: every hot kernel matched against the cards, the recipe per shape, the plan and what it should buy."""
