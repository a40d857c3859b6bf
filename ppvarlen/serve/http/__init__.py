"""The HTTP transport: the edge (errors, auth, JSON), the fast path and connection limits."""
