"""Tests of rl_core.pretrained."""
