"""The node's side of the protocol: gateway, gRPC client, roster, statements, masks, unmask."""
