"""Egress: the hands' only way out, and the credentials they never see."""

from .policy import EgressPolicy, EgressSettings
from .proxy import EgressProxy, Listener
from .vault import Credential, Vault

__all__ = ["Credential", "EgressPolicy", "EgressProxy", "EgressSettings", "Listener", "Vault"]
