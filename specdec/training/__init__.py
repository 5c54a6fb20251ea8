"""Training drafters for a target: self-distilled data, the EAGLE-style head's trainer."""
