"""simulations: sweeps, attacks and reproductions comparing correlated and independent noise."""
