"""Pure typed values and rules: no I/O, no third-party imports beyond PyYAML in config."""
