"""A functional RL loop with token-level advantages (GRPO, DAPO, RF-B, SPAE): issue 17."""
