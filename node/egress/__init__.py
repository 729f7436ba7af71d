"""What leaves a TRE: the bundle, its audit, approval and receipt, the release and its budget."""
