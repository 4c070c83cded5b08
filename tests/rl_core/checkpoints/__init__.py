"""Tests of rl_core.checkpoints."""
