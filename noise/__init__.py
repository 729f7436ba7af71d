"""noise: pure math and crypto for zero-sum correlated noise (no grpc, no node)."""
