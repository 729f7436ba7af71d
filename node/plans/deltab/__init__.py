"""The brain-age plan (deltab): its rounds, cohort, settings and delta summary."""
