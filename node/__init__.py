"""node: the TRE side — data loading, deltab training, egress bundles, review gate, gRPC client."""
