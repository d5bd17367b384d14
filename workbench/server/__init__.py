"""The Jupyter server extension: REST and websocket API, and the brain's home in the server.

Import `workbench.server.app` for the extension app; this package imports nothing on its own.
"""
