"""coordinator: the aggregator — gRPC server, session state machine, persistence."""
