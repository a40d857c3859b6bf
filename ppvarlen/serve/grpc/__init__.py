"""The gRPC transport: the front-end process and the frames it relays calls in."""
