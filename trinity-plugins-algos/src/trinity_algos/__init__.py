"""Algorithm components (PPO, GRPO, OPMD, DPO, SFT, ...) for Trinity."""
