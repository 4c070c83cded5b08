"""Wire formats shared by rl_core, the control plane and the SDK (pure Python, no JAX)."""
