"""Observing: a call's outputs as a notebook and the model see them, within a budget."""
