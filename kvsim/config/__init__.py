"""Configuration: units, profile value types, engine presets, scenarios and loading."""
