"""A multi-turn WebShop environment and workflow for Trinity."""
