"""The choice: candidate layouts per rack type, the CP-SAT fleet model, the exhaustive reference, explanations."""
