"""The robustness campaign: fuzzing, a faulty network, a full disk, crashes and load."""
