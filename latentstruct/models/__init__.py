"""Model parts: encoders, scorers, decoders."""
