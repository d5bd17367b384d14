"""Isolating: what keeps a kernel in its place (seccomp, workspace quotas, limits, identities, freezing)."""
