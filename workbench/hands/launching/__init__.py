"""Launching: how kernels start, talk and end (local, sandboxed, on a gateway), pooled and reaped."""
