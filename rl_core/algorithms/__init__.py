"""Policy-gradient objectives as pure functions over arrays."""
