"""Math and countdown workflows, rewards and task generators for Trinity."""
