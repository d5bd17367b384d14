"""Each session's egress proxy, for the launchers whose kernels go out through one (sandbox, gateway)."""

from __future__ import annotations

from ...egress import EgressPolicy, EgressProxy, EgressSettings, Vault
from ..base import Place


class SessionProxies:
    """A session's proxy is made once (its request count and budgets span its kernels) and kept in its Place;
    the warm pool's kernels share one that denies everything until a session adopts them."""

    def __init__(self, vault: Vault | None, settings: EgressSettings | None):
        self.vault, self.settings = vault, settings
        self._pool: EgressProxy | None = None

    def of(self, place: Place | None) -> EgressProxy:
        """The session's proxy (a bad policy raises ConfigError here, before a kernel is made); the pool's for None."""
        if place is None:
            if self._pool is None:
                self._pool = EgressProxy(EgressPolicy.from_config(None, self.settings), self.vault, None, self.settings)
            return self._pool
        if "egress" not in place.held:
            policy = EgressPolicy.from_config(place.egress, self.settings)
            place.held["egress"] = EgressProxy(policy, self.vault, place.sink, self.settings)
        proxy: EgressProxy = place.held["egress"]
        return proxy
