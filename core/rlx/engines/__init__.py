"""Rollout engines beyond the native one (``rlx.rollout``): each an optional extra."""
