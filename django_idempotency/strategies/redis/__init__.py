"""Everything that talks to Redis: the ``redis`` strategy, the store its scripts run on
(also ``hybrid``'s hot path), the fallback's health and the checks of the connection. The
only part of the package that imports ``redis``."""
