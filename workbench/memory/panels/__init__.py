"""Panels for people: memory review (Panel, ipywidgets) over the memory store or the REST API."""
