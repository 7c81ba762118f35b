"""Where everything runs: pipeline stages on concrete accelerators and experts on ranks."""
