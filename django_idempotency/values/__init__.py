"""The values every layer shares: the stored response, the key's digest, the attempt and
the outcomes of a claim. The bottom of the package: it imports Django alone (no setting,
no store, no vendor, no Redis), and the store, the strategies and the protocol import it."""
